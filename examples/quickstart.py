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

from kinesis_actors import KinesisBroker, KinesisStream, StartAt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--endpoint", help="Kinesis + DynamoDB endpoint (default: start the embedded emulator)")
    parser.add_argument("--records", type=int, default=10, help="how many records to publish and read back")
    args = parser.parse_args(argv)

    with contextlib.ExitStack() as stack:
        endpoint = args.endpoint
        if endpoint is None:
            from kinesis_actors.emulator import Emulator

            endpoint = stack.enter_context(Emulator()).endpoint  # a child process, stopped on exit
        print(f"emulator at {endpoint}")

        broker = KinesisBroker(endpoint=endpoint, region="us-east-1", test_credentials=True)
        conn = stack.enter_context(broker.connect())  # starts a local Ray runtime if none is running
        stream = f"quickstart-{uuid.uuid4().hex[:6]}"
        with conn.subscribe(KinesisStream(stream, create_if_missing=2, start_at=StartAt.trim_horizon()),
                            sink=None) as sub:  # pull mode: next_batch() hands the batches to this process
            conn.publisher(stream).put_many([(f"order {i}", f"customer-{i % 3}") for i in range(args.records)])
            seen: set[tuple[str, str]] = set()
            deadline = time.monotonic() + 30
            while len(seen) < args.records and time.monotonic() < deadline:
                for record in sub.next_batch(timeout_s=1.0):  # asking again acknowledges this batch
                    seen.add((record.shard_id, record.sequence_number))
                    print(f"{record.shard_id}  seq {record.sequence_number}  key {record.partition_key}  "
                          f"{record.data.decode()}")
            print(f"read {len(seen)} of {args.records} records; leases held: {len(sub.leases())}")
        # leaving the block acknowledged the last batch, checkpointed and released the leases
    return 0 if len(seen) == args.records else 1


if __name__ == "__main__":
    sys.exit(main())
