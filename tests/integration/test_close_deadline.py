"""``Subscription.close(timeout_s=)``: one deadline for the whole close, whatever hangs.

Real Coordinator and ShardReader actors on the emulator; the lease table is made to hang
through the fault layer (every DynamoDB call of the store's clients waits far past the
deadline), so neither the readers' releases nor the Coordinator's close can finish.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from kinesis_actors import DynamoLeaseStore, InvalidError, KinesisBroker, KinesisStream, StartAt
from kinesis_actors.testing import Fault, FaultInjector, with_faults

from .helpers import drain

pytestmark = pytest.mark.usefixtures("ray_session")

DEADLINE_S = 3.0
MARGIN_S = 7.0  # killing the actors, and a loaded 2-core machine; far below the minute a hung close takes


def test_close_returns_by_its_deadline_while_the_lease_table_hangs(
        endpoint: str, unique: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    stream = f"deadline-{unique}"
    faults = FaultInjector.create(tmp_path / "faults")
    broker = with_faults(KinesisBroker(endpoint=endpoint, region="us-east-1", test_credentials=True,
                                       lease_store=DynamoLeaseStore(f"leases-{unique}", create_if_missing=True),
                                       lease_duration_s=6.0, renew_interval_s=1.5),
                         faults, lease_store=True).connect()
    try:
        sub = broker.subscribe(KinesisStream(stream, create_if_missing=2, start_at=StartAt.trim_horizon(),
                                             lease_poll_interval_s=0.3))
        broker.publisher(stream).put_many([(b"x%d" % i, f"k{i}") for i in range(10)])
        drain(sub, 10)
        with pytest.raises(InvalidError):
            sub.close(timeout_s=0)  # checked before anything is stopped
        with pytest.raises(InvalidError):
            sub.close(timeout_s="soon")  # type: ignore[arg-type]
        faults.set(Fault("*", service="dynamodb", error=None, delay_s=600.0))  # the table never answers
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="kinesis_actors.subscription"):
            sub.close(timeout_s=DEADLINE_S)
        took = time.monotonic() - started
        assert took < DEADLINE_S + MARGIN_S, f"close() took {took:.1f} s with a {DEADLINE_S} s deadline"
        assert any("left to expire" in r.getMessage() and stream in r.getMessage() for r in caplog.records)
        sub.close()  # idempotent
    finally:
        faults.clear()
        broker.shutdown()
