"""Read a stream with kinesis_actors, end to end, on the embedded emulator (no AWS account).

    .venv/bin/python examples/quickstart.py                        # starts its own emulator
    .venv/bin/python examples/quickstart.py --endpoint http://127.0.0.1:4567   # one you started

It creates a 2-shard stream, subscribes in pull mode from TRIM_HORIZON, publishes ten
records, prints each as it arrives, checks that all ten arrived, closes the subscription
(checkpoint, release) and exits 0. It needs the ``emulator`` extra (moto) only when it
starts its own emulator.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import uuid

from kinesis_actors import KinesisBroker, KinesisError, KinesisStream, StartAt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--endpoint", help="Kinesis + DynamoDB endpoint (default: start the embedded emulator)")
    parser.add_argument("--records", type=int, default=10, help="how many records to publish and read back")
    args = parser.parse_args(argv)
    try:
        return run(args.endpoint, args.records)
    except KinesisError as e:  # every error of the library is one: its message names the cause
        print(f"error: {e}", file=sys.stderr)
        return 1


def partition_keys(n: int) -> list[str]:
    """``n`` partition keys, ``customer-0`` ... : Kinesis routes a record by the MD5 of its key, and
    ten distinct keys reach both shards of a 2-shard stream (``customer-4``, ``-7``, ``-9`` hash
    below 2**127, the others above)."""
    return [f"customer-{i}" for i in range(n)]


def run(endpoint: str | None, records: int) -> int:
    """Publish ``records`` records and read them back; 0 when every one arrived."""
    with contextlib.ExitStack() as stack:
        if endpoint is None:
            from kinesis_actors.emulator import Emulator

            endpoint = stack.enter_context(Emulator()).endpoint  # a child process, stopped on exit
            print(f"started the embedded emulator at {endpoint}")
        else:
            print(f"using the endpoint {endpoint}")

        broker = KinesisBroker(endpoint=endpoint, region="us-east-1", test_credentials=True)
        conn = stack.enter_context(broker.connect())  # no Ray yet: subscribe() starts it after checking the stream
        stream = f"quickstart-{uuid.uuid4().hex[:6]}"
        with conn.subscribe(KinesisStream(stream, create_if_missing=2, start_at=StartAt.trim_horizon()),
                            sink=None) as sub:  # pull mode: next_batch() hands the batches to this process
            conn.publisher(stream).put_many([(f"order {i}", key) for i, key in enumerate(partition_keys(records))])
            seen: set[tuple[str, str]] = set()
            deadline = time.monotonic() + 30
            while len(seen) < records and time.monotonic() < deadline:
                for record in sub.next_batch(timeout_s=1.0):  # asking again acknowledges this batch
                    seen.add((record.shard_id, record.sequence_number))
                    print(f"{record.shard_id}  seq {record.sequence_number}  key {record.partition_key}  "
                          f"{record.data.decode()}")
            print(f"read {len(seen)} of {records} records; leases held: {len(sub.leases())}")
        # leaving the block acknowledged the last batch, checkpointed and released the leases
    return 0 if len(seen) == records else 1


if __name__ == "__main__":
    sys.exit(main())
