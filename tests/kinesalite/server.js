// Serve kinesalite on 127.0.0.1 (kinesalite's own CLI has no --host).
// Usage: node server.js [port]   (port 0 or absent: any free port)
// Prints one line, "kinesalite listening on 127.0.0.1:<port>", once it accepts connections.
// Exits when its standard input closes, so it never outlives the test session that started it.
'use strict'
const kinesalite = require('kinesalite')

const port = Number(process.argv[2] || 0)
const server = kinesalite({
  shardLimit: Number(process.env.KINESALITE_SHARD_LIMIT || 1000), // default 10 per account
  createStreamMs: Number(process.env.KINESALITE_CREATE_STREAM_MS || 50),
  deleteStreamMs: Number(process.env.KINESALITE_DELETE_STREAM_MS || 50),
  updateStreamMs: Number(process.env.KINESALITE_UPDATE_STREAM_MS || 50),
})
server.on('error', (err) => { console.error(`kinesalite: ${err.message}`); process.exit(1) })
server.listen(port, '127.0.0.1', () => {
  console.log(`kinesalite listening on 127.0.0.1:${server.address().port}`)
})
process.stdin.on('end', () => process.exit(0))
process.stdin.on('error', () => process.exit(0))
process.stdin.resume()
