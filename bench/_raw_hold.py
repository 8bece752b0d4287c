"""Plain boto3, one thread per shard, in a fresh process: drain every shard from TRIM_HORIZON,
then go on polling each at its tip (one GetRecords per shard every 0.25 s) until stdin closes.

The raw floor of a consumer's memory: the benchmark samples this process's USS once it has
printed ``REACHED`` (every record read). Usage: ``_raw_hold.py ENDPOINT STREAM EXPECT``.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import boto3
from botocore.config import Config


def main() -> int:
    endpoint, stream, expect = sys.argv[1], sys.argv[2], int(sys.argv[3])
    k = boto3.client("kinesis", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                     aws_secret_access_key="testing", config=Config(max_pool_connections=100))
    shards = []
    resp = k.list_shards(StreamName=stream)
    while True:
        shards += [s["ShardId"] for s in resp["Shards"]]
        if not resp.get("NextToken"):
            break
        resp = k.list_shards(StreamName=stream, NextToken=resp["NextToken"])
    lock = threading.Lock()
    total = [0]
    done = threading.Event()

    def read(shard_id: str) -> None:
        it = k.get_shard_iterator(StreamName=stream, ShardId=shard_id,
                                  ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while it:
            resp = k.get_records(ShardIterator=it, Limit=10_000)
            it = resp.get("NextShardIterator")
            if resp["Records"]:
                with lock:
                    total[0] += len(resp["Records"])
                    if total[0] >= expect and not done.is_set():
                        done.set()
                        print(f"REACHED {total[0]}", flush=True)
            else:
                time.sleep(0.25)

    for sid in shards:
        threading.Thread(target=read, args=(sid,), daemon=True).start()
    sys.stdin.read()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
