// Loaded with `node -r ./preload.js main.js` by kinesis_actors.emulator.kinesis_mock.
// kinesis-mock listens on every interface and has no host option: every server it opens
// is bound to 127.0.0.1 instead. It also exits when the Python process that started it
// (KA_PARENT_PID) is gone, checked every 250 ms.
"use strict";
const net = require("net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === "number" || typeof args[0] === "string") {
    const port = Number(args[0]);
    const cb = args.find((a) => typeof a === "function");
    return listen.call(this, { port, host: "127.0.0.1" }, cb);
  }
  if (args[0] && typeof args[0] === "object") {
    args[0] = { ...args[0], host: "127.0.0.1" };
  }
  return listen.apply(this, args);
};
const parent = Number(process.env.KA_PARENT_PID || 0);
if (parent > 0) {
  setInterval(() => {
    try {
      process.kill(parent, 0);
    } catch (e) {
      process.exit(0);
    }
    if (process.ppid !== parent) process.exit(0);
  }, 250).unref();
}
