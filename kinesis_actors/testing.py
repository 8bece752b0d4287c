"""Fakes for testing code built on ``kinesis_actors`` (shipped in the package, FastStream style).

- :class:`InProcessLeaseStore`: the full lease logic with its rows in this process (no
  Ray, no network); ``store.peer()`` gives a second "host" over the same rows.
- :class:`FlakyLeaseStore`: wraps any lease store and fails the Nth call of a chosen
  method with a chosen exception (the idea of KCL's ``ExceptionThrowingLeaseRefresher``).
- :class:`FaultInjector` and :class:`Fault`: a botocore event hook that answers chosen
  AWS operations, for chosen shards, with service errors (throttling, expired
  iterators, ``InternalFailure``), delays or hangs, in every process of a Ray cluster
  (see :func:`with_faults`).
- :class:`FakeKinesis`: an in-memory Kinesis client (``ListShards``,
  ``DescribeStreamSummary``, ``GetShardIterator``, ``GetRecords``) over many shards,
  with scripted errors per shard, closed shards and call counts.
- :class:`FakeShard` and :class:`FakeKinesis` also serve enhanced fan-out
  (``open_subscription``, the transport :class:`~kinesis_actors.fanout.FanOutFetcher`
  uses): AWS event-stream frames (:func:`encode_event_frame`) with scripted refusals,
  dropped connections (also in the middle of a frame), exception events, the end of a
  subscription and ``ChildShards`` at a closed shard's end.
- :class:`FakeClock`: a monotonic clock a test moves by hand, with an ``async sleep`` on it;
  :class:`InlineIo`: a reader's IO with calls made inline, for readers on a fake clock.
- :class:`LocalReader`: the Coordinator's ``ReaderHandle`` over a
  :class:`~kinesis_actors.reader.ShardReaderCore` in the test's own event loop, with a
  ``kill()`` that behaves like a SIGKILL of the reader process.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import datetime as _dt
import json
import os
import random
import struct
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from .clock import monotonic_s, wall_s
from .errors import LeaseStoreError
from .leases.memory import InProcessLeaseStore

__all__ = ["InProcessLeaseStore", "FlakyLeaseStore", "Fault", "FaultInjector", "FaultCall", "with_faults",
           "FakeKinesis", "FakeShard", "FakeSubscription", "encode_event_frame", "FakeClock", "InlineIo", "LocalReader",
           "client_error", "kpl_aggregate"]


class FlakyLeaseStore:
    """A lease store wrapper that fails chosen calls of one method; every other call passes through.

    Calls of ``method`` are counted from 1; calls ``nth`` to ``nth + times - 1`` raise
    ``exception``. With ``when="before"`` (default) the failing call never reaches the
    inner store (nothing changes); with ``when="after"`` the inner call runs first and
    its result is lost (a write that happened although the caller saw an error, like a
    lost response).

    Args:
        inner: the lease store to wrap.
        method: name of the method to fail, e.g. ``"renew"`` or ``"checkpoint"``.
        nth: the first call (1-based) that fails.
        exception: the exception instance or class to raise; default a retriable
            ``LeaseStoreError``.
        times: how many consecutive calls fail (default 1).
        when: ``"before"`` or ``"after"`` the inner call.

    Attributes:
        calls: how many times ``method`` was called so far.
        failures: how many of them failed.

    Example:
        >>> store = FlakyLeaseStore(InProcessLeaseStore(), "renew", nth=2)
        >>> lease = store.take("s", "shardId-0", owner="a", duration_s=1.0)
        >>> lease = store.renew(lease)   # call 1 passes
        >>> store.renew(lease)           # call 2 raises LeaseStoreError
        Traceback (most recent call last):
        ...
        kinesis_actors.errors.LeaseStoreError: injected failure of renew (call 2)
    """

    def __init__(
        self,
        inner: Any,
        method: str,
        *,
        nth: int = 1,
        exception: BaseException | type[BaseException] | None = None,
        times: int = 1,
        when: str = "before",
    ) -> None:
        if not callable(getattr(inner, method, None)):
            raise ValueError(f"{type(inner).__name__} has no method {method!r}")
        if nth < 1 or times < 1:
            raise ValueError(f"nth and times must be >= 1, got nth={nth!r}, times={times!r}")
        if when not in ("before", "after"):
            raise ValueError(f"when must be 'before' or 'after', got {when!r}")
        self.inner = inner
        self.method = method
        self.nth = nth
        self.times = times
        self.when = when
        self.exception = exception
        self.calls = 0
        self.failures = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"FlakyLeaseStore({self.inner!r}, {self.method!r}, nth={self.nth}, times={self.times})"

    def _error(self, call: int) -> BaseException:
        exc = self.exception
        if exc is None:
            return LeaseStoreError(f"injected failure of {self.method} (call {call})", retriable=True)
        if isinstance(exc, type):
            return exc(f"injected failure of {self.method} (call {call})")
        return exc

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("inner", "method", "_lock"):
            raise AttributeError(name)  # not delegated (keeps pickling and copying sane)
        attr = getattr(self.inner, name)
        if name != self.method:
            return attr

        def flaky(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls += 1
                call = self.calls
                fail = self.nth <= call < self.nth + self.times
                if fail:
                    self.failures += 1
            if fail and self.when == "before":
                raise self._error(call)
            result = attr(*args, **kwargs)
            if fail:
                raise self._error(call)
            return result

        return flaky


# ---------------------------------------------------------------------------- fault injection
_ERROR_STATUS = {
    "InternalFailure": 500,
    "InternalServerError": 500,
    "ServiceUnavailable": 503,
    "ServiceUnavailableException": 503,
}


@dataclasses.dataclass(frozen=True)
class Fault:
    """One rule of a :class:`FaultInjector`: which calls it hits and how it answers them.

    Attributes:
        operation: the AWS API name (``"GetRecords"``, ``"ListShards"``,
            ``"DescribeStreamSummary"``...) or ``"*"`` for every operation.
        error: the AWS error code to answer with (``"ProvisionedThroughputExceededException"``,
            ``"LimitExceededException"``, ``"ExpiredIteratorException"``, ``"InternalFailure"``...),
            as an HTTP error response (400, or 500/503 for server faults) that botocore
            parses and may retry like a real one; None to answer normally (after ``delay_s``).
        shards: only calls on these shard ids (``ShardId``, or the shard a ``ShardIterator``
            was issued for); empty: any call.
        probability: chance, 0..1, that a matching call is hit.
        times: hit at most this many calls in all (counted across processes); None: no limit.
        delay_s: seconds to wait before answering (a slow service; with ``error=None`` and a
            long delay, a call that is stuck whatever the client's timeout says).
        hang: no answer at all: the call waits out the client's read timeout and fails with
            botocore's ``ReadTimeoutError``, as a hung connection does.
        refuse: the endpoint is down: the call fails at once with botocore's
            ``EndpointConnectionError`` (which botocore retries as a network error).
        service: the botocore service the rule applies to (``"kinesis"``).
    """

    operation: str
    error: str | None = "ProvisionedThroughputExceededException"
    shards: tuple[str, ...] = ()
    probability: float = 1.0
    times: int | None = None
    delay_s: float = 0.0
    hang: bool = False
    refuse: bool = False
    service: str = "kinesis"

    def __post_init__(self) -> None:
        if not isinstance(self.operation, str) or not self.operation:
            raise ValueError(f"operation must be an AWS API name or '*', got {self.operation!r}")
        if not 0.0 <= float(self.probability) <= 1.0:
            raise ValueError(f"probability must be within 0..1, got {self.probability!r}")
        if self.times is not None and self.times < 1:
            raise ValueError(f"times must be >= 1 or None, got {self.times!r}")
        if self.delay_s < 0:
            raise ValueError(f"delay_s must be >= 0, got {self.delay_s!r}")
        if isinstance(self.shards, str):
            object.__setattr__(self, "shards", (self.shards,))

    def matches(self, service: str, operation: str, shard: str | None) -> bool:
        """True if a call of ``operation`` on ``shard`` (None: unknown) is one this rule targets."""
        if service != self.service or self.operation not in ("*", operation):
            return False
        return not self.shards or shard in self.shards


@dataclasses.dataclass(frozen=True)
class FaultCall:
    """One HTTP attempt seen by a :class:`FaultInjector` (from its call log).

    Attributes:
        time: epoch seconds when the attempt was made. pid: the process that made it.
        service, operation: e.g. ``"kinesis"``, ``"GetRecords"``. shard: the shard id, or None.
        fault: what was injected: an error code, ``"hang"``, ``"delay"``, or None (passed through).
    """

    time: float
    pid: int
    service: str
    operation: str
    shard: str | None
    fault: str | None


class _Raw:
    """The ``raw`` of a fake botocore ``AWSResponse``: a body read through ``stream()``."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Any:
        return iter([self._body])


class _InjectorState:
    """Per process: the rules last read, the shard each iterator was issued for."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.rules: list[tuple[str, Fault]] = []
        self.rules_mtime: int | None = None
        self.lock = threading.Lock()
        self.iterators: dict[str, str] = {}
        self.tls = threading.local()

    def current_rules(self) -> list[tuple[str, Fault]]:
        path = os.path.join(self.directory, "rules.json")
        try:
            mtime = os.stat(path).st_mtime_ns
        except FileNotFoundError:
            return []
        with self.lock:
            if mtime != self.rules_mtime:
                with open(path, encoding="utf-8") as f:
                    doc = json.load(f)
                self.rules = [(r.pop("id"), Fault(**{**r, "shards": tuple(r.get("shards", ()))})) for r in doc["rules"]]
                self.rules_mtime = mtime
            return list(self.rules)

    def note_iterator(self, iterator: str | None, shard: str | None) -> None:
        if iterator and shard:
            with self.lock:
                if len(self.iterators) > 10_000:
                    self.iterators.clear()
                self.iterators[iterator] = shard


_STATES: dict[str, _InjectorState] = {}
_STATES_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class FaultInjector:
    """Injects AWS service faults through botocore event hooks, in every process.

    The injector is a small picklable value (a directory): it travels inside
    :class:`~kinesis_actors.aws.AwsSettings` (field ``faults``) into the Coordinator and
    ShardReader actors, and every boto3 client built from those settings installs its
    hooks. The rules live in ``<directory>/rules.json`` and are re-read by every process
    when the file changes, so a test changes them while the actors run. Every HTTP
    attempt of a hooked client is appended to ``<directory>/calls.jsonl`` (see
    :meth:`calls`). Clients built without an injector carry no hook at all.

    Faults are answered before the request is sent (botocore's ``before-send`` event), as
    an HTTP error response that botocore parses, and retries where its retry mode says so,
    exactly like a real one.

    Args:
        directory: a directory shared by the processes (created if missing).

    Example:
        >>> faults = FaultInjector.create(tmp_path)                      # doctest: +SKIP
        >>> broker = with_faults(KinesisBroker(endpoint=url, test_credentials=True), faults)  # doctest: +SKIP
        >>> faults.set(Fault("GetRecords", probability=0.5))               # doctest: +SKIP
        >>> faults.clear()                                                 # doctest: +SKIP
    """

    directory: str

    @classmethod
    def create(cls, directory: Any) -> FaultInjector:
        """An injector in ``directory`` (created if missing) with no rules and an empty call log."""
        path = os.fspath(directory)
        os.makedirs(path, exist_ok=True)
        for name in os.listdir(path):
            if name == "calls.jsonl" or name.startswith("count-"):
                os.unlink(os.path.join(path, name))
        injector = cls(path)
        injector.clear()
        return injector

    # ------------------------------------------------------------------ control (the test's side)
    def set(self, *faults: Fault) -> None:
        """Replace the rules (every process sees them on its next call). Counters of
        ``times`` start again from zero."""
        for fault in faults:
            if not isinstance(fault, Fault):
                raise TypeError(f"set() takes Fault rules, got {fault!r}")
        stamp = uuid.uuid4().hex[:8]
        doc = {"rules": [{"id": f"{stamp}-{i}", **dataclasses.asdict(f)} for i, f in enumerate(faults)]}
        tmp = os.path.join(self.directory, f".rules-{stamp}.json")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        os.replace(tmp, os.path.join(self.directory, "rules.json"))

    def clear(self) -> None:
        """Remove every rule: calls pass through (and are still logged)."""
        self.set()

    def calls(self, operation: str | None = None, *, shard: str | None = None, since: float = 0.0) -> list[FaultCall]:
        """The HTTP attempts logged so far, oldest first, optionally of one operation or shard."""
        out: list[FaultCall] = []
        try:
            with open(os.path.join(self.directory, "calls.jsonl"), encoding="utf-8") as f:
                lines = f.readlines()
        except FileNotFoundError:
            return out
        for line in lines:
            try:
                call = FaultCall(**json.loads(line))
            except (ValueError, TypeError):
                continue  # a line being written right now
            if operation is not None and call.operation != operation:
                continue
            if shard is not None and call.shard != shard:
                continue
            if call.time >= since:
                out.append(call)
        return sorted(out, key=lambda c: c.time)

    # ------------------------------------------------------------------ hooks (every process)
    def _state(self) -> _InjectorState:
        with _STATES_LOCK:
            state = _STATES.get(self.directory)
            if state is None:
                state = _STATES[self.directory] = _InjectorState(self.directory)
            return state

    def install(self, client: Any, *, read_timeout_s: float | None = None) -> Any:
        """Register the hooks on a boto3 client (``AwsSettings.client`` calls this); returns it."""
        state = self._state()
        service = client.meta.service_model.service_id.hyphenize()
        timeout = float(read_timeout_s if read_timeout_s is not None else client.meta.config.read_timeout)
        events = client.meta.events

        def before_params(params: dict[str, Any], model: Any, **_: Any) -> None:
            shard = params.get("ShardId")
            if shard is None and params.get("ShardIterator"):
                shard = state.iterators.get(params["ShardIterator"])
            state.tls.call = (model.name, shard)

        def before_send(request: Any, **_: Any) -> Any:
            operation, shard = getattr(state.tls, "call", (None, None))
            if operation is None:
                return None
            fault = self._pick(state, service, operation, shard)
            self._log(service, operation, shard, None if fault is None else
                      ("refuse" if fault.refuse else "hang" if fault.hang else fault.error or "delay"))
            if fault is None:
                return None
            if fault.refuse:
                from botocore.exceptions import EndpointConnectionError

                raise EndpointConnectionError(endpoint_url=request.url)
            if fault.delay_s:
                time.sleep(fault.delay_s)
            if fault.hang:
                from botocore.exceptions import ReadTimeoutError

                time.sleep(timeout)
                raise ReadTimeoutError(endpoint_url=request.url)
            if fault.error is None:
                return None
            return self._error_response(request, fault.error)

        def after_call(parsed: dict[str, Any], model: Any, **_: Any) -> None:
            _operation, shard = getattr(state.tls, "call", (None, None))
            if model.name == "GetShardIterator":
                state.note_iterator(parsed.get("ShardIterator"), shard)
            elif model.name == "GetRecords":
                state.note_iterator(parsed.get("NextShardIterator"), shard)

        events.register(f"before-parameter-build.{service}", before_params, unique_id=f"ka-faults-params-{id(client)}")
        events.register(f"before-send.{service}", before_send, unique_id=f"ka-faults-send-{id(client)}")
        events.register(f"after-call.{service}", after_call, unique_id=f"ka-faults-after-{id(client)}")
        return client

    def _pick(self, state: _InjectorState, service: str, operation: str, shard: str | None) -> Fault | None:
        for rule_id, fault in state.current_rules():
            if not fault.matches(service, operation, shard):
                continue
            if fault.probability < 1.0 and random.random() >= fault.probability:
                continue
            if fault.times is not None and not self._count(rule_id, fault.times):
                continue
            return fault
        return None

    def _count(self, rule_id: str, times: int) -> bool:
        """Take one of the rule's ``times`` (a counter file under an exclusive lock)."""
        import fcntl

        path = os.path.join(self.directory, f"count-{rule_id}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            used = int(os.read(fd, 32) or b"0")
            if used >= times:
                return False
            os.lseek(fd, 0, os.SEEK_SET)
            os.ftruncate(fd, 0)
            os.write(fd, str(used + 1).encode())
            return True
        finally:
            os.close(fd)

    def _log(self, service: str, operation: str, shard: str | None, fault: str | None) -> None:
        line = json.dumps({"time": wall_s(), "pid": os.getpid(), "service": service,
                           "operation": operation, "shard": shard, "fault": fault}) + "\n"
        fd = os.open(os.path.join(self.directory, "calls.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())  # one short O_APPEND write: lines never interleave
        finally:
            os.close(fd)

    @staticmethod
    def _error_response(request: Any, code: str) -> Any:
        from botocore.awsrequest import AWSResponse

        body = json.dumps({"__type": code, "message": f"injected by kinesis_actors.testing.FaultInjector: {code}"})
        headers = {"x-amzn-RequestId": uuid.uuid4().hex, "Content-Type": "application/x-amz-json-1.1",
                   "Content-Length": str(len(body))}
        return AWSResponse(request.url, _ERROR_STATUS.get(code, 400), headers, _Raw(body.encode()))


def with_faults(broker: Any, injector: FaultInjector | None, *, lease_store: bool = False) -> Any:
    """Give a not-yet-connected ``KinesisBroker`` a fault injector; returns the broker.

    Every Kinesis client built for it (the driver's, the Coordinator's and each
    ShardReader's) then carries the injector's hooks. The lease store keeps its own
    settings (no faults) unless ``lease_store=True``: then every DynamoDB client of its
    ``DynamoLeaseStore`` (in every process) carries them too, and rules with
    ``service="dynamodb"`` reach the lease table (e.g. ``Fault("*", service="dynamodb",
    refuse=True)``: the table unreachable). That store object is changed in place.

    Raises:
        ValueError: the broker is already connected, or ``lease_store=True`` without a
        ``DynamoLeaseStore``.
    """
    from .errors import InvalidError

    try:
        broker.inject_faults(injector)
    except InvalidError as e:
        raise ValueError("with_faults() must be applied before connect()") from e
    if lease_store:
        from .leases.dynamodb import DynamoLeaseStore

        store = broker.lease_store
        if not isinstance(store, DynamoLeaseStore):
            raise ValueError(f"with_faults(lease_store=True) needs a DynamoLeaseStore, got {store!r}")
        store.inject_faults(injector)
    return broker


# ---------------------------------------------------------------------------- in-memory Kinesis
def kpl_aggregate(users: list[tuple[str, bytes]]) -> tuple[str, str, bytes]:
    """One KPL aggregated record holding ``users`` (partition key, data) in order.

    Built with ``aws-kinesis-agg``'s ``RecordAggregator`` (the format the KPL writes), so
    tests feed readers the bytes producers really send.

    Returns:
        (partition key, explicit hash key, the aggregated bytes) for one ``PutRecord``.

    Raises:
        ValueError: the users do not fit in one aggregated record (1 MiB).
    """
    from aws_kinesis_agg.aggregator import RecordAggregator

    agg = RecordAggregator()
    for key, data in users:
        if agg.add_user_record(key, data) is not None:
            raise ValueError(f"{len(users)} user records do not fit in one aggregated record")
    pk, ehk, blob = agg.clear_and_get().get_contents()
    return pk, ehk, blob


def client_error(code: str, operation: str = "GetRecords", status: int = 400) -> Exception:
    """A botocore ``ClientError`` with AWS error code ``code`` (as boto3 raises it)."""
    from botocore.exceptions import ClientError

    response: Any = {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
    error: Exception = ClientError(response, operation)
    return error


class FakeShard:
    """One shard of :class:`FakeKinesis` (also a Kinesis client for one shard on its own):
    records with sequence numbers ``"1"``, ``"2"``...; iterators are positions.

    Attributes:
        records: the records as ``GetRecords`` returns them.
        closed: a closed shard: ``NextShardIterator`` is null once it is read to its end.
        faults: what the next ``GetRecords`` calls do, in order: an AWS error code to
            raise, ``"hang"`` to block until :attr:`release` is set (at most 30 s; a call
            stuck whatever the client's timeout says), or None to answer normally.
        iterator_faults: AWS error codes the next ``GetShardIterator`` calls raise.
        calls: times of the ``GetRecords`` calls, read from :attr:`clock`.
        clock: the clock :attr:`calls` reads (``time.monotonic`` unless a test sets its
            fake clock, so call spacing is measured on the reader's clock).
        iterator_requests: the arguments of each ``GetShardIterator``.
        hang_s: seconds every ``GetRecords`` sleeps before answering (a slow shard).
        max_per_call: most records one response holds (AWS stops at 10 MiB), or None.
        lag_ms: ``MillisBehindLatest`` of a response that did not reach the tip.
        release: the event a ``"hang"`` fault waits for.
        subscribe_faults: AWS error codes the next ``SubscribeToShard`` calls raise
            (enhanced fan-out; see :meth:`open_subscription`).
        stream_faults: what the next reads of a subscription do, in order: None (an
            event), ``"drop"`` (the connection resets), ``"drop-mid-event"`` (half of the
            next event's frame arrives, then the connection resets), ``"end"`` (the
            service ends the subscription), or an AWS code (an exception event).
        subscriptions: the ``StartingPosition`` of each accepted ``SubscribeToShard``.
        open_subscriptions: the subscriptions not closed yet; a new one while one is open
            is refused with ``ResourceInUseException``, as AWS does.
        event_interval_s: real seconds each read of a subscription waits before its event
            (AWS and kinesis-mock push events over time; 0.01 s here).
        child_shard_ids: ``ChildShards`` of the last event of a closed shard.
        refuse_in_stream: answer a subscription refused for being in use as kinesis-mock
            does (accepted, then a ``ResourceInUseException`` frame) instead of raising.

    Args:
        n: records to start with. closed: see above.
        arrivals: epoch seconds of each starting record's ``ApproximateArrivalTimestamp``
            (instead of ``n``; default: now).
    """

    def __init__(self, n: int = 0, *, closed: bool = False, arrivals: list[float] | None = None,
                 max_per_call: int | None = None, lag_ms: int = 1000) -> None:
        self.records: list[dict[str, Any]] = []
        self.closed = closed
        self.faults: list[str | None] = []
        self.iterator_faults: list[str] = []
        self.calls: list[float] = []
        self.clock: Callable[[], float] = monotonic_s
        self.iterator_requests: list[dict[str, Any]] = []
        self.hang_s = 0.0
        self.max_per_call = max_per_call
        self.lag_ms = lag_ms
        self.release = threading.Event()
        self.subscribe_faults: list[str] = []
        self.stream_faults: list[str | None] = []
        self.subscriptions: list[dict[str, Any]] = []
        self.open_subscriptions: list[FakeSubscription] = []
        self.event_interval_s = 0.01
        self.child_shard_ids: list[str] = ["shardId-child-0"]
        self.refuse_in_stream = False
        self._sub_lock = threading.Lock()
        self.add(n)
        for when in arrivals or ():
            self.add(1, arrival=_dt.datetime.fromtimestamp(when, _dt.timezone.utc))

    def add(self, n: int, data: bytes | None = None, *, arrival: _dt.datetime | None = None) -> None:
        """Append ``n`` records (payload ``data``, default ``b"r<seq>"``)."""
        for _ in range(n):
            seq = len(self.records) + 1
            at = arrival or _dt.datetime.fromtimestamp(wall_s(), _dt.timezone.utc)
            self.records.append({"Data": data or f"r{seq}".encode(), "PartitionKey": "k", "SequenceNumber": str(seq),
                                 "ApproximateArrivalTimestamp": at})

    def get_shard_iterator(self, *, ShardIteratorType: str, StreamName: str = "", ShardId: str = "",
                           **kw: Any) -> dict[str, str]:
        self.iterator_requests.append({"ShardIteratorType": ShardIteratorType, **kw})
        if self.iterator_faults:
            raise client_error(self.iterator_faults.pop(0), "GetShardIterator")
        pos = {"TRIM_HORIZON": 0, "LATEST": len(self.records)}.get(ShardIteratorType)
        if ShardIteratorType == "AT_SEQUENCE_NUMBER":
            pos = int(kw["StartingSequenceNumber"]) - 1
        elif ShardIteratorType == "AFTER_SEQUENCE_NUMBER":
            pos = int(kw["StartingSequenceNumber"])
        elif ShardIteratorType == "AT_TIMESTAMP":
            when = kw["Timestamp"]
            pos = next((i for i, r in enumerate(self.records) if r["ApproximateArrivalTimestamp"] >= when),
                       len(self.records))
        return {"ShardIterator": str(pos)}

    def get_records(self, *, ShardIterator: str, Limit: int = 10_000) -> dict[str, Any]:
        self.calls.append(self.clock())
        if self.hang_s:
            time.sleep(self.hang_s)
        fault = self.faults.pop(0) if self.faults else None
        if fault == "hang":
            self.release.wait(30)
        elif fault is not None:
            raise client_error(fault)
        pos = int(ShardIterator)
        limit = Limit if self.max_per_call is None else min(Limit, self.max_per_call)
        out = self.records[pos : pos + limit]
        nxt = pos + len(out)
        end = self.closed and nxt >= len(self.records)
        return {"Records": out, "NextShardIterator": None if end else str(nxt),
                "MillisBehindLatest": 0 if nxt >= len(self.records) else self.lag_ms}

    def _position_of(self, starting: dict[str, Any]) -> int:
        kind = starting["Type"]
        if kind == "TRIM_HORIZON":
            return 0
        if kind == "LATEST":
            return len(self.records)
        if kind == "AT_SEQUENCE_NUMBER":
            return int(starting["SequenceNumber"]) - 1
        if kind == "AFTER_SEQUENCE_NUMBER":
            return int(starting["SequenceNumber"])
        when = starting["Timestamp"]
        return next((i for i, r in enumerate(self.records) if r["ApproximateArrivalTimestamp"] >= when),
                    len(self.records))

    def open_subscription(self, params: dict[str, Any]) -> FakeSubscription:
        """``SubscribeToShard`` (the :data:`~kinesis_actors.fanout.Subscribe` transport):
        a :class:`FakeSubscription` from ``params["StartingPosition"]``.

        Raises:
            botocore.exceptions.ClientError: the next of :attr:`subscribe_faults`, or
                ``ResourceInUseException`` while another subscription is open.
        """
        with self._sub_lock:
            if self.subscribe_faults:
                raise client_error(self.subscribe_faults.pop(0), "SubscribeToShard")
            if self.open_subscriptions:
                if not self.refuse_in_stream:
                    raise client_error("ResourceInUseException", "SubscribeToShard")
                refused = FakeSubscription(self, 0)
                refused.refused = True
                return refused
            starting = dict(params["StartingPosition"])
            pos = self._position_of(starting)
            self.subscriptions.append(starting)
            sub = FakeSubscription(self, pos)
            self.open_subscriptions.append(sub)
            return sub

    def _closed_subscription(self, sub: FakeSubscription) -> None:
        with self._sub_lock:
            if sub in self.open_subscriptions:
                self.open_subscriptions.remove(sub)


def encode_event_frame(headers: dict[str, str], payload: bytes) -> bytes:
    """One AWS event-stream frame (prelude, string headers, payload, both CRC32s), as
    ``botocore.eventstream.EventStreamBuffer`` decodes it. For fakes and tests."""
    raw_headers = b"".join(struct.pack("B", len(k)) + k.encode() + b"\x07" + struct.pack(">H", len(v.encode()))
                           + v.encode() for k, v in headers.items())
    total = 12 + len(raw_headers) + len(payload) + 4
    prelude = struct.pack(">II", total, len(raw_headers))
    prelude += struct.pack(">I", binascii.crc32(prelude) & 0xFFFFFFFF)
    body = prelude + raw_headers + payload
    return body + struct.pack(">I", binascii.crc32(body) & 0xFFFFFFFF)


class FakeSubscription:
    """One open subscription of a :class:`FakeShard` (an :class:`~kinesis_actors.fanout.EventSource`).

    Each :meth:`read` waits ``shard.event_interval_s`` and returns one
    ``SubscribeToShardEvent`` frame with the records after its position (at most
    ``shard.max_per_call``), or does what the next of ``shard.stream_faults`` says.
    """

    def __init__(self, shard: FakeShard, pos: int) -> None:
        self.shard = shard
        self.pos = pos
        self.closed = False
        self.events = 0
        self._pending = b""
        self._broken = False
        self.refused = False  # answers one ResourceInUseException frame, then ends

    def _event(self) -> bytes:
        shard = self.shard
        limit = shard.max_per_call or 10_000
        out = shard.records[self.pos : self.pos + limit]
        self.pos += len(out)
        end = shard.closed and self.pos >= len(shard.records)
        body: dict[str, Any] = {
            "Records": [{"Data": base64.b64encode(r["Data"]).decode(), "PartitionKey": r["PartitionKey"],
                         "SequenceNumber": r["SequenceNumber"],
                         "ApproximateArrivalTimestamp": r["ApproximateArrivalTimestamp"].timestamp()} for r in out],
            "ContinuationSequenceNumber": None if end else str(self.pos),
            "MillisBehindLatest": 0 if self.pos >= len(shard.records) else shard.lag_ms,
            "ChildShards": [{"ShardId": c, "ParentShards": ["x"]} for c in shard.child_shard_ids] if end else None,
        }
        self.events += 1
        return encode_event_frame({":message-type": "event", ":event-type": "SubscribeToShardEvent",
                                   ":content-type": "application/json"}, json.dumps(body).encode())

    def read(self) -> bytes:
        if self.closed:
            return b""
        if self.refused:
            self.closed = True
            return encode_event_frame({":message-type": "exception", ":exception-type": "ResourceInUseException"},
                                      b'{"message": "Another active subscription exists"}')
        if self._broken:
            self.close()
            raise ConnectionResetError("connection reset (fake)")
        if self._pending:
            out, self._pending = self._pending, b""
            return out
        time.sleep(self.shard.event_interval_s)
        fault = self.shard.stream_faults.pop(0) if self.shard.stream_faults else None
        if fault == "drop":
            self.close()
            raise ConnectionResetError("connection reset (fake)")
        if fault == "end":
            self.close()
            return b""
        if fault == "drop-mid-event":
            pos = self.pos
            frame = self._event()
            self.pos = pos  # never fully received: the service did not deliver it
            self._broken = True
            return frame[: len(frame) // 2]
        if fault is not None:
            self.close()
            return encode_event_frame({":message-type": "exception", ":exception-type": fault,
                                       ":content-type": "application/json"}, json.dumps({"message": fault}).encode())
        return self._event()

    def close(self) -> None:
        self.closed = True
        self.shard._closed_subscription(self)


class FakeKinesis:
    """An in-memory Kinesis client over ``n_shards`` :class:`FakeShard` s (thread-safe enough
    for the reader's pools: each shard is read by one loop at a time).

    Iterators are ``"<shard id>|<position>"``. ``list_shards`` and
    ``describe_stream_summary`` describe the stream; ``calls`` counts every operation.

    Args:
        n_shards: shards ``shardId-000000000000`` onwards, each with ``records`` records.
        stream: the stream name ``describe_stream_summary`` reports.
        listing: what ``ListShards`` returns instead (shard dicts as AWS gives them).
        created: the stream's creation time, reported with its ARN.
    """

    def __init__(self, n_shards: int = 0, *, records: int = 0, stream: str = "s",
                 listing: list[dict[str, Any]] | None = None, created: _dt.datetime | None = None) -> None:
        self.stream = stream
        self.shards = {f"shardId-{i:012d}": FakeShard(records) for i in range(n_shards)}
        self.listing = listing
        self.created = created
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()

    def _count(self, operation: str) -> None:
        with self._lock:
            self.calls[operation] = self.calls.get(operation, 0) + 1

    def list_shards(self, **_: Any) -> dict[str, Any]:
        """``listing`` as given (resharding: parents, closed shards), else one open shard per fake shard."""
        self._count("ListShards")
        if self.listing is not None:
            return {"Shards": self.listing}
        return {"Shards": [{"ShardId": sid, "SequenceNumberRange": {"StartingSequenceNumber": "1"}}
                           for sid in self.shards]}

    def describe_stream_summary(self, **_: Any) -> dict[str, Any]:
        """With ``created``: the stream's ARN and creation time (its identity), as AWS gives them."""
        self._count("DescribeStreamSummary")
        summary: dict[str, Any] = {"StreamName": self.stream, "StreamStatus": "ACTIVE",
                                   "OpenShardCount": len(self.shards)}
        if self.created is not None:
            summary.update(StreamARN=f"arn:aws:kinesis:us-east-1:0:stream/{self.stream}",
                           StreamCreationTimestamp=self.created)
        return {"StreamDescriptionSummary": summary}

    def get_shard_iterator(self, *, ShardId: str, **kw: Any) -> dict[str, str]:
        self._count("GetShardIterator")
        inner = self.shards[ShardId].get_shard_iterator(ShardId=ShardId, **kw)["ShardIterator"]
        return {"ShardIterator": f"{ShardId}|{inner}"}

    def get_records(self, *, ShardIterator: str, Limit: int = 10_000) -> dict[str, Any]:
        self._count("GetRecords")
        sid, pos = ShardIterator.split("|")
        out = self.shards[sid].get_records(ShardIterator=pos, Limit=Limit)
        if out["NextShardIterator"] is not None:
            out["NextShardIterator"] = f"{sid}|{out['NextShardIterator']}"
        return out

    def open_subscription(self, params: dict[str, Any]) -> FakeSubscription:
        """``SubscribeToShard`` on ``params["ShardId"]`` (see :meth:`FakeShard.open_subscription`)."""
        self._count("SubscribeToShard")
        return self.shards[params["ShardId"]].open_subscription(params)

    def publish(self, n: int, data: bytes | None = None) -> None:
        """Append ``n`` records to every shard."""
        for shard in self.shards.values():
            shard.add(n, data)


class FakeClock:
    """A monotonic clock for tests: ``clock()`` returns the time, ``advance(s)`` moves it, and
    ``await clock.sleep(s)`` waits until it has moved ``s`` seconds (inject it where the code
    under test sleeps, so a test drives time without waiting on the wall clock).

    Args:
        start: the first reading, seconds. follow_real: add the real monotonic time that
            passed since creation (so asyncio sleeps still move it), default False; then
            :meth:`sleep` sleeps in real time.
    """

    def __init__(self, start: float = 1000.0, *, follow_real: bool = False) -> None:
        self._offset = start
        self._follow = follow_real
        self._t0 = monotonic_s()
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def __call__(self) -> float:
        return self._offset + (monotonic_s() - self._t0 if self._follow else 0.0)

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``; wakes the sleepers that are due."""
        self._offset += seconds
        now, waiting = self(), []
        for due, future in self._sleepers:
            if future.done():
                continue
            if due <= now:
                future.set_result(None)
            else:
                waiting.append((due, future))
        self._sleepers = waiting

    async def sleep(self, seconds: float) -> None:
        """Return once the clock has moved ``seconds`` forward (at once for ``seconds <= 0``,
        after yielding to the event loop)."""
        if self._follow:
            await asyncio.sleep(seconds)
            return
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self() + seconds, future))
        await future

    def next_due_in(self) -> float | None:
        """Seconds until the earliest pending :meth:`sleep` is due, or None if none waits."""
        pending = [due for due, future in self._sleepers if not future.done()]
        return max(0.0, min(pending) - self()) if pending else None

    async def until(self, cond: Callable[[], Any], *, within_s: float, what: str = "the condition",
                    step_s: float = 0.01) -> None:
        """Drive the clock (:meth:`run_for` steps of ``step_s``) until ``cond()`` is true.

        Raises:
            AssertionError: ``within_s`` seconds of this clock passed first (a test failure
                naming ``what``).
        """
        end = self() + within_s
        while not cond():
            assert self() < end, f"not within {within_s} s of the fake clock: {what}"
            await self.run_for(step_s)

    async def finish(self, work: Any, *, within_s: float = 60.0, step_s: float = 0.01) -> Any:
        """Drive the clock until the awaitable ``work`` is done; its result (or its exception).

        Raises:
            AssertionError: not done within ``within_s`` seconds of this clock.
        """
        task = asyncio.ensure_future(work)
        await self.until(task.done, within_s=within_s, what="the call to return", step_s=step_s)
        return task.result()

    async def run_for(self, seconds: float, *, step_s: float = 0.01) -> None:
        """Move the clock ``seconds`` forward in steps of at most ``step_s``, letting the event
        loop run every ready task between steps (no wall-clock sleep)."""
        end = self() + seconds
        while (left := end - self()) > 1e-12:
            for _ in range(20):
                await asyncio.sleep(0)
            self.advance(min(step_s, left))
        for _ in range(20):
            await asyncio.sleep(0)


class LocalReader:
    """The Coordinator's ``ReaderHandle`` over a ``ShardReaderCore`` in this event loop.

    ``kill()`` is a SIGKILL of the reader process: every consumer is cancelled where it
    stands (no checkpoint, no release; a store write already sent still lands), and
    every later call raises ``ReaderGone``, as Ray's ``ActorDiedError`` does.

    Args:
        core: the reader (``kinesis_actors.reader.ShardReaderCore``).
        start_delay_s: how long ``ping`` takes the first time (an actor starting), seconds
            of ``sleep``'s clock.
        sleep: ``async sleep(seconds)`` that delay waits on; default ``asyncio.sleep`` (pass
            a :class:`FakeClock`'s ``sleep`` to start on fake time).
    """

    def __init__(self, core: Any, *, start_delay_s: float = 0.0, sleep: Any = asyncio.sleep) -> None:
        self.core = core
        self.start_delay_s = start_delay_s
        self._sleep = sleep
        self.dead = False
        self.calls: dict[str, int] = {}
        self.lease_ages: dict[str, float | None] = {}  # shard id -> lease_age_s of its last add
        self.handoff_requests: list[tuple[str, str]] = []  # (shard id, asker) passed on by the Coordinator
        self._killed: asyncio.Future[None] | None = None  # done once killed (wakes the calls in flight)

    def _check(self, method: str) -> None:
        from .coordinator import ReaderGone

        self.calls[method] = self.calls.get(method, 0) + 1
        if self.dead:
            raise ReaderGone("LocalReader killed")

    async def _guard(self, method: str, awaitable: Any) -> Any:
        """Run a call; if the reader is killed meanwhile, raise ReaderGone like Ray does."""
        from .coordinator import ReaderGone

        try:
            self._check(method)
        except ReaderGone:
            awaitable.close()  # the call never reaches the dead reader (and is not left unawaited)
            raise
        task = asyncio.ensure_future(awaitable)
        if self._killed is None:
            self._killed = asyncio.get_running_loop().create_future()
        await asyncio.wait({task, self._killed}, return_when=asyncio.FIRST_COMPLETED)
        if self.dead:
            task.cancel()
            raise ReaderGone("LocalReader killed")
        return task.result()

    async def ping(self) -> None:
        self._check("ping")
        if self.start_delay_s:
            await self._sleep(self.start_delay_s)
            self.start_delay_s = 0.0

    async def add(self, spec: Any, lease: Any, *, lease_age_s: float | None = None) -> Any:
        """The core's ``add``; ``lease_age_s`` is recorded in ``lease_ages`` and passed on."""
        self.lease_ages[spec.shard_id] = lease_age_s
        return await self._guard("add", self.core.add(spec, lease, lease_age_s=lease_age_s))

    async def request_handoff(self, shard_id: str, asker: str) -> bool:
        """The core's ``request_handoff`` (a plain call: it marks the consumer), kept in ``handoff_requests``."""
        self.handoff_requests.append((shard_id, asker))
        self._check("request_handoff")
        accepted: bool = self.core.request_handoff(shard_id, asker)
        return accepted

    async def events(self, timeout_s: float) -> Any:
        return await self._guard("events", self.core.events(timeout_s))

    async def stop(self, shard_id: str | None, release: bool, grace_s: float) -> None:
        await self._guard("stop", self.core.stop(shard_id, release=release, grace_s=grace_s))

    async def seek(self, shard_id: str, position: Any) -> bool:
        moved: bool = await self._guard("seek", self.core.seek(shard_id, position))
        return moved

    async def stats(self) -> dict[str, Any]:
        self._check("stats")
        figures: dict[str, Any] = self.core.stats()
        return figures

    def kill(self) -> None:
        """SIGKILL: cancel every consumer without writing; later calls raise ReaderGone."""
        if self.dead:
            return
        self.dead = True
        if self._killed is not None and not self._killed.done():
            self._killed.set_result(None)
        self.core.abort()


class InlineIo:
    """The reader's IO seam (``kinesis_actors.reader.ReaderIo``'s interface) with every
    blocking call made inline on the event loop: with a :class:`FakeClock` as the reader's
    clock and sleep, a test runs readers without threads and without wall-clock waits.

    Args:
        clock: the fake clock whose ``sleep`` a delayed call waits on.
        delay_s: ``delay_s(pool, args)`` -> seconds of fake time a call waits before it
            runs (``pool`` is ``"kinesis"``, ``"store"`` or ``"stream"``; ``args`` the call's
            arguments, a store write's first one being the Lease; for ``"kinesis"``, the
            shard id the call is for, then the call's arguments); default none.
        threads: most calls of one pool running at once (a delayed call holds its place
            while it waits, like a thread of ``ReaderIo``'s pools); None: no bound.

    Attributes:
        hang_store: while True, every new lease-store call waits forever (a lease table
            that never answers); ``hung`` counts them.
    """

    def __init__(self, clock: FakeClock, *, delay_s: Any = None, threads: int | None = None) -> None:
        self.clock = clock
        self.delay_s = delay_s
        self._pools = {pool: asyncio.Semaphore(threads) if threads else None for pool in ("kinesis", "store", "stream")}
        self.hang_store = False
        self.hung = 0

    async def _run(self, pool: str, fn: Any, args: tuple[Any, ...], seen: tuple[Any, ...] | None = None) -> Any:
        slots = self._pools[pool]
        if slots is not None:
            async with slots:
                return await self._call(fn, args, pool, args if seen is None else seen)
        return await self._call(fn, args, pool, args if seen is None else seen)

    async def _call(self, fn: Any, args: tuple[Any, ...], pool: str, seen: tuple[Any, ...]) -> Any:
        wait = self.delay_s(pool, seen) if self.delay_s is not None else 0.0
        if wait:
            await self.clock.sleep(wait)
        return fn(*args)

    async def kinesis(self, fn: Any, *args: Any, limited: bool = True, shard: str | None = None) -> Any:
        return await self._run("kinesis", fn, args, (shard, *args))

    async def stream(self, fn: Any, *args: Any) -> Any:
        return await self._run("stream", fn, args)

    async def store(self, fn: Any, *args: Any) -> Any:
        if self.hang_store:
            self.hung += 1
            await asyncio.get_running_loop().create_future()
        return await self._run("store", fn, args)

    def note_renewal(self, latency_s: float, renew_interval_s: float) -> None:
        """No call limit here."""
