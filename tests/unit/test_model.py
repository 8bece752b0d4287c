"""Configuration, positions, records, publisher splitting and error translation (no Ray, no network)."""

from __future__ import annotations

import datetime as dt
import pickle
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from kinesis_actors import (
    InvalidError,
    KinesisBroker,
    KinesisStream,
    LeaseLostError,
    LeaseStoreError,
    SinkError,
    StartAt,
    StreamError,
)
from kinesis_actors.errors import KinesisError, translate_aws_error
from kinesis_actors.leases.rows import LocalRows
from kinesis_actors.publisher import MAX_REQUEST_BYTES, _chunks, _entry
from kinesis_actors.records import records_from_response
from kinesis_actors.testing import InProcessLeaseStore as InProcessLeaseStoreBase
from kinesis_actors.testing import client_error


@pytest.mark.parametrize("position", [
    StartAt.latest(), StartAt.trim_horizon(), StartAt.at_timestamp(dt.datetime(2024, 1, 2, tzinfo=dt.timezone.utc)),
    StartAt.at_sequence_number("4959" * 14), StartAt.after_sequence_number("12", 3),
])
def test_start_at_round_trips(position: StartAt) -> None:
    assert StartAt.parse(position.to_str()) == position


def test_start_at_refuses_bad_values() -> None:
    with pytest.raises(InvalidError, match="timezone-aware"):
        StartAt.at_timestamp(dt.datetime(2024, 1, 2))
    with pytest.raises(InvalidError):
        StartAt.at_sequence_number("12a")
    with pytest.raises(InvalidError):
        StartAt("SOMEWHERE")


def test_resume_inside_an_aggregate_uses_at_sequence_number() -> None:
    assert StartAt.after_sequence_number("7", 2).iterator_args() == {
        "ShardIteratorType": "AT_SEQUENCE_NUMBER", "StartingSequenceNumber": "7"}
    assert StartAt.after_sequence_number("7").iterator_args() == {
        "ShardIteratorType": "AFTER_SEQUENCE_NUMBER", "StartingSequenceNumber": "7"}


@pytest.mark.parametrize("kwargs", [
    {"create_if_missing": 0}, {"create_if_missing": True}, {"shard_sync_interval_s": 0}, {"lease_poll_interval_s": -1},
    {"max_records": 10_001}, {"max_leases": 0}, {"reader_options": {"bogus": 1}}, {"sink_method": "not a name"},
    {"start_at": "LATEST"}, {"start_at": StartAt.at_sequence_number("1")}, {"max_sink_retries": -1},
    {"coordinator_options": {"max_restarts": 3}}, {"coordinator_options": "head"},
])
def test_kinesis_stream_validation(kwargs: dict) -> None:
    with pytest.raises(InvalidError):
        KinesisStream("orders", **kwargs)


def test_kinesis_stream_defaults_and_actor_options() -> None:
    cfg = KinesisStream("orders", reader_options={"resources": {"reader": 1}})
    assert (cfg.shard_sync_interval_s, cfg.lease_poll_interval_s, cfg.max_leases_to_steal) == (10.0, 2.0, 1)
    assert cfg.actor_options() == {"num_cpus": 0, "scheduling_strategy": "SPREAD", "resources": {"reader": 1}}
    assert cfg.coordinator_actor_options() == {"num_cpus": 0}
    pinned = KinesisStream("orders", coordinator_options={"resources": {"head": 0.01}})
    assert pinned.coordinator_actor_options() == {"num_cpus": 0, "resources": {"head": 0.01}}
    with pytest.raises(TypeError):
        KinesisStream("orders", 4)  # type: ignore[misc]  # only the name is positional


def test_broker_constructor_does_no_io_and_validates() -> None:
    broker = KinesisBroker(endpoint="http://127.0.0.1:1", region="us-east-1", test_credentials=True)
    assert "127.0.0.1:1" in repr(broker) and "testing" not in repr(broker)
    for bad in ({"endpoint": "localhost:1"}, {"owner_id": ""}, {"lease_duration_s": float("nan")},
                {"renew_interval_s": 10.0, "lease_duration_s": 10.0}):
        with pytest.raises(InvalidError):
            KinesisBroker(**bad)


def test_publisher_entries_and_splitting() -> None:
    assert _entry(("text", "k")) == {"Data": b"text", "PartitionKey": "k"}
    assert _entry((b"x", "k", "123"))["ExplicitHashKey"] == "123"
    for bad in [(b"x",), (1, "k"), (b"x", ""), (b"x", "k" * 257), (b"x", "k", "-1"), (b"x", "k", str(2**128))]:
        with pytest.raises(InvalidError):
            _entry(bad)
    small = [_entry((b"x", "k")) for _ in range(1201)]
    assert [len(c) for c in _chunks(small)] == [500, 500, 201]
    big = [_entry((b"x" * (1024 * 1024 - 10), "k")) for _ in range(11)]
    chunks = list(_chunks(big))
    assert all(sum(len(big[i]["Data"]) + 1 for i in c) <= MAX_REQUEST_BYTES for c in chunks)
    assert [i for c in chunks for i in c] == list(range(11)), "input order kept"


def test_plain_records_pass_through() -> None:
    when = dt.datetime(2024, 1, 1)
    out = records_from_response([{"Data": b"abc", "PartitionKey": "k", "SequenceNumber": "9",
                                  "ApproximateArrivalTimestamp": when}], shard_id="s0", stream="st")
    assert out[0].data == b"abc" and out[0].sub_sequence_number is None
    assert out[0].approximate_arrival_timestamp.tzinfo == dt.timezone.utc


def test_errors_translate_and_pickle() -> None:
    def err(code: str, status: int = 400) -> ClientError:
        return ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "Op")

    assert isinstance(translate_aws_error(err("ResourceNotFoundException"), operation="X"), StreamError)
    auth = translate_aws_error(err("UnrecognizedClientException"), operation="X")
    assert isinstance(auth, StreamError) and "authentication" in str(auth)
    throttled = translate_aws_error(err("ProvisionedThroughputExceededException"), operation="X")
    assert throttled.retriable and throttled.aws_code == "ProvisionedThroughputExceededException"
    assert translate_aws_error(EndpointConnectionError(endpoint_url="http://x"), operation="X").retriable
    for error in (SinkError("s"), LeaseStoreError("t", aws_code="C", retriable=True)):
        clone = pickle.loads(pickle.dumps(error))
        assert type(clone) is type(error) and clone.aws_code == error.aws_code and clone.retriable == error.retriable
    assert issubclass(InvalidError, KinesisError) and issubclass(InvalidError, ValueError)


# ------------------------------------------------------------------ writes that land although they failed
class _LandsThenFailsRows(LocalRows):
    """The next ``update`` is applied, then answered as the chosen failure: ``"retry"`` (a
    timed-out UpdateItem whose first attempt landed, retried: the condition now fails) or
    ``"error"`` (the call raised a transient error after the row changed)."""

    fail: str | None = None

    def update(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        new = super().update(*args, **kwargs)
        mode, self.fail = self.fail, None
        if mode == "retry":
            return None
        if mode == "error":
            raise LeaseStoreError("read timeout (injected)", retriable=True)
        return new


class _LandsThenFails(InProcessLeaseStoreBase):
    """An in-process store over :class:`_LandsThenFailsRows`; ``fail`` arms the next update."""

    def __init__(self) -> None:
        super().__init__(_LandsThenFailsRows())

    @property
    def fail(self) -> str | None:
        return self._rows.fail  # type: ignore[attr-defined,no-any-return]

    @fail.setter
    def fail(self, mode: str | None) -> None:
        self._rows.fail = mode  # type: ignore[attr-defined]


def test_a_renewal_whose_retry_fails_its_condition_after_the_first_attempt_landed_is_kept() -> None:
    store = _LandsThenFails()
    lease = store.take("s", "shardId-0", owner="a", duration_s=10.0)
    store.fail = "retry"
    renewed = store.renew(lease)
    assert renewed.counter == lease.counter + 1 and renewed.owner == "a"
    assert store.renew(renewed).counter == lease.counter + 2, "and the next write goes on from it"


def test_a_write_retried_by_its_caller_after_a_transient_error_that_landed_applies_on_top() -> None:
    store = _LandsThenFails()
    lease = store.take("s", "shardId-0", owner="a", duration_s=10.0)
    store.fail = "error"
    with pytest.raises(LeaseStoreError):
        store.checkpoint(lease, "7")
    again = store.checkpoint(lease, "7")  # the caller still holds the old Lease
    assert again.counter == lease.counter + 2 and again.checkpoint == "7" and again.owner == "a"


def test_our_owner_id_re_taken_after_an_unconfirmed_write_is_a_lost_lease() -> None:
    store = _LandsThenFails()
    zombie = store.take("s", "shardId-0", owner="a", duration_s=10.0)
    store.fail = "error"
    with pytest.raises(LeaseStoreError):
        store.renew(zombie)
    coordinator = store.peer()
    assert coordinator.take("s", "shardId-0", owner="a", duration_s=10.0) is not None  # same owner id: re-homed
    with pytest.raises(LeaseLostError):
        store.renew(zombie)
    with pytest.raises(LeaseLostError):
        _LandsThenFails().renew(zombie)  # another store, nothing unconfirmed: plainly lost


def test_an_endpoint_that_refuses_connections_is_named_and_not_retried_past_botocore() -> None:
    import socket

    from kinesis_actors.aws import AwsSettings
    from kinesis_actors.kinesis import ensure_stream
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = AwsSettings(endpoint=f"http://127.0.0.1:{port}", region="us-east-1", test_credentials=True).client("kinesis")
    sent: list[str] = []
    client.meta.events.register("before-send", lambda request, **_: sent.append(request.url))
    with pytest.raises(KinesisError) as err:
        ensure_stream(client, "orders", create_shards=None)
    max_attempts = client.meta.config.retries["total_max_attempts"]  # botocore's own attempts (standard mode)
    assert 1 <= len(sent) <= max_attempts, f"no retry of a refused connection beyond botocore's attempts: {sent}"
    assert f"http://127.0.0.1:{port}" in str(err.value) and "Connection refused" in str(err.value)
    assert "transient" not in str(err.value)


def test_missing_credentials_name_the_cause_in_one_chained_step(monkeypatch: pytest.MonkeyPatch) -> None:
    from botocore.exceptions import NoCredentialsError

    from kinesis_actors.kinesis import ensure_stream

    class NoCredentials:
        def describe_stream_summary(self, **_: object) -> None:
            raise NoCredentialsError()

    with pytest.raises(StreamError, match="no AWS credentials found") as err:
        ensure_stream(NoCredentials(), "orders", create_shards=4)
    assert isinstance(err.value.__cause__, NoCredentialsError) and err.value.__cause__.__cause__ is None
    assert err.value.__context__ is err.value.__cause__, "raised where it happened, not from the create branch"


class _PartialPuts:
    """A Kinesis client whose PutRecords fails the entries named in ``fail`` once each, and
    throttles the whole call ``throttle`` times first."""

    def __init__(self, fail: set[bytes], throttle: int = 0) -> None:
        self.fail, self.throttle, self.calls = set(fail), throttle, []

    def put_records(self, *, StreamName: str, Records: list[dict[str, Any]]) -> dict[str, Any]:
        self.calls.append([r["Data"] for r in Records])
        if self.throttle:
            self.throttle -= 1
            raise client_error("ProvisionedThroughputExceededException", "PutRecords")
        out = []
        for r in Records:
            if r["Data"] in self.fail:
                self.fail.discard(r["Data"])
                out.append({"ErrorCode": "InternalFailure"})
            else:
                out.append({"ShardId": "shardId-0", "SequenceNumber": str(len(self.calls))})
        return {"Records": out}


def test_publisher_retries_failed_entries_and_throttled_calls_in_one_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from kinesis_actors import publisher as publisher_module
    from kinesis_actors.aws import AwsSettings
    from kinesis_actors.connection import ConnectionState
    from kinesis_actors.publisher import Publisher

    slept: list[float] = []
    monkeypatch.setattr(publisher_module, "time", SimpleNamespace(sleep=slept.append))
    state = ConnectionState.detached(AwsSettings(test_credentials=True))
    client = _PartialPuts({b"b"}, throttle=1)
    state._clients["kinesis/0"] = client  # the publisher asks for a client without botocore's retries
    results = Publisher("s", state, max_attempts=3).put_many([(b"a", "k"), (b"b", "k")])
    assert [r.shard_id for r in results] == ["shardId-0", "shardId-0"]
    assert client.calls == [[b"a", b"b"], [b"a", b"b"], [b"b"]], "throttled, then only the failed entry again"
    assert len(slept) == 2
    stuck = _PartialPuts(set(), throttle=10)
    state._clients["kinesis/0"] = stuck
    with pytest.raises(KinesisError) as e:
        Publisher("s", state, max_attempts=3).put_many([(b"a", "k")])
    assert len(stuck.calls) == 3 and e.value.retriable
