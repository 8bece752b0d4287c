"""Drain one shard with plain boto3 (GetRecords Limit 10000) in a fresh process, then wait
for stdin to close: the parent samples this process's USS (the raw anchor of a reader's memory)."""

from __future__ import annotations

import sys

import boto3


def main() -> int:
    endpoint, stream, shard_id, expect = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    k = boto3.client("kinesis", endpoint_url=endpoint, region_name="us-east-1",
                     aws_access_key_id="testing", aws_secret_access_key="testing")
    it = k.get_shard_iterator(StreamName=stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    n = 0
    print("START", flush=True)
    while n < expect:
        resp = k.get_records(ShardIterator=it, Limit=10_000)
        if not resp["Records"]:
            break
        n += len(resp["Records"])
        it = resp["NextShardIterator"]
    print(f"DONE {n}", flush=True)
    sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main())
