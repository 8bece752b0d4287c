"""The moto patches the emulator's server process applies before it serves, and why.

Before serving, the server process monkeypatches ``moto.kinesis.models.Shard`` in
place (the patch never runs in the parent process; :func:`serve` applies it to the
process that serves):

* **Lost records.** Stock ``Shard.put_record`` computes ``max sequence number + 1``
  and then stores the record without a lock. The werkzeug server is threaded, so two
  concurrent PutRecords into one shard can compute the same number and one record
  silently overwrites the other (a rate: ``bench/DESIGN_FIGURES.md``). Each
  shard now has its **own** ``threading.Lock`` held while one record is numbered and
  stored: there is no global lock, so a long PutRecords into one shard never delays
  other shards, other streams or DynamoDB.
* **O(n) PutRecords.** Stock ``get_max_sequence_number`` (and
  ``get_min_sequence_number``) copy every key of the shard (``list(records.keys())``)
  on every put, so PutRecords slows down linearly as a shard fills. Each shard now
  keeps an append-only ascending list of its sequence numbers: min and max are O(1).
* **Quadratic draining.** Stock ``Shard.get_records`` scans the shard from its first
  record on every call. It now bisects the sequence-number list (O(log n + limit)),
  keeping the return contract ``(records, last_sequence_int, millis_behind_latest)``:
  the records after ``last_sequence_id`` in order, at most ``limit`` (all when
  ``limit`` is None or <= 0), the sequence number of the last one returned (or the
  input when none), and the arrival gap in ms between that record and the newest one.
* ``get_sequence_number_at`` (AT_TIMESTAMP iterators) bisects a running maximum of the
  arrival times instead of scanning.
* ``Record.created_at`` is whatever moto makes it: epoch seconds (a float) up to moto
  5.2.5, a naive UTC ``datetime`` from 5.2.6. The index keeps it as it is (a running
  maximum compares either) and :func:`_seconds` turns a difference of two into seconds.
* ``Shard.records`` becomes a property: moto's ``split_shard`` replaces the dict
  wholesale, and the setter rebuilds the index.
* **A slow GetRecords body.** moto's generic serializer walks the botocore shape of every
  member of every record; ``KinesisResponse.get_records`` now writes the same JSON
  document directly (:mod:`.get_records_body`), after a self-test that compares the two.
* **Non-atomic conditional writes.** moto's DynamoDB evaluates a ``ConditionExpression``
  and then writes, with no lock: two racing conditional ``UpdateItem`` calls can both
  succeed (seen in about 1 run in 10 with 8 racing lease takers), which real DynamoDB
  never allows. Item reads and writes of the DynamoDB backend now run under one
  DynamoDB lock (each call is well under a millisecond, and Kinesis never waits on it).

The patch checks moto's internals before touching them (method signatures, that no
other code in ``moto/kinesis/models.py`` writes into ``Shard.records``) and runs a
behavioural self-test afterwards; if anything has changed shape it raises
:class:`MotoPatchError` at startup instead of serving a silently wrong emulator.

Other moto behaviours are left as they are: small per-shard
integer sequence numbers, a NextShardIterator that is never null, no iterator expiry,
writes after resharding going to the closed parent.
"""

from __future__ import annotations

import bisect
import collections
import datetime
import functools
import inspect
import logging
import re
import threading
from collections.abc import Callable
from typing import Any

from .errors import MotoPatchError

__all__ = ["patch_moto", "check_moto_shape"]

log = logging.getLogger("kinesis_actors.emulator")

_PATCH_MARK = "_kinesis_actors_patched"


def _params(func: Any) -> list[str]:
    return list(inspect.signature(func).parameters)


def check_moto_shape(models: Any) -> None:
    """Raise MotoPatchError unless moto.kinesis.models looks like the patched 5.2.x code."""
    for name in ("Shard", "Record", "Stream"):
        if not isinstance(getattr(models, name, None), type):
            raise MotoPatchError(f"moto.kinesis.models.{name} is missing or not a class")
    shard_cls, record_cls = models.Shard, models.Record
    expected = {
        "__init__": ["self", "shard_id", "starting_hash", "ending_hash", "parent", "adjacent_parent"],
        "put_record": ["self", "partition_key", "data", "explicit_hash_key"],
        "get_records": ["self", "last_sequence_id", "limit"],
        "get_min_sequence_number": ["self"],
        "get_max_sequence_number": ["self"],
        "get_sequence_number_at": ["self", "at_timestamp"],
    }
    for method, params in expected.items():
        func = getattr(shard_cls, method, None)
        if not callable(func):
            raise MotoPatchError(f"moto.kinesis.models.Shard.{method} is missing")
        if _params(func) != params:
            raise MotoPatchError(
                f"moto.kinesis.models.Shard.{method}{inspect.signature(func)} changed; expected parameters {params}"
            )
    if "records" in shard_cls.__dict__:
        raise MotoPatchError("moto.kinesis.models.Shard.records is a class attribute; expected an instance dict")
    record_params = ["self", "partition_key", "data", "sequence_number", "explicit_hash_key"]
    if _params(record_cls.__init__) != record_params:
        raise MotoPatchError(
            f"moto.kinesis.models.Record.__init__{inspect.signature(record_cls.__init__)} changed; "
            f"expected parameters {record_params}"
        )
    # The index stays right only if Shard.put_record is the one writer into a shard's
    # records dict (reassigning the whole dict goes through the property setter).
    try:
        source = inspect.getsource(models)
        put_source = inspect.getsource(shard_cls.put_record)
    except (OSError, TypeError) as exc:
        raise MotoPatchError(f"cannot read moto.kinesis.models source to verify the patch: {exc}") from exc
    writers = re.compile(
        r"\.records\[[^\]]*\]\s*=(?!=)"  # shard.records[seq] = ...
        r"|del\s+[\w.]*records\["
        r"|\.records\.(pop|popitem|clear|update|setdefault|move_to_end)\("
    )
    outside_put = writers.findall(source.replace(put_source, ""))
    if outside_put or not writers.search(put_source):
        raise MotoPatchError(
            "moto.kinesis.models writes Shard.records outside Shard.put_record "
            f"({len(outside_put)} other writer(s)); the sequence-number index would go stale"
        )


def _install_shard_patch(models: Any) -> None:
    """Replace moto's ``Shard`` storage and its record methods by the indexed ones (once)."""
    shard_cls = models.Shard
    shard_cls.__init__, shard_cls.records = _indexed_storage(shard_cls.__init__)
    for func in (_indexed_put_record(models.Record), *_indexed_reads()):
        func.__qualname__ = f"Shard.{func.__name__}"
        func.__doc__ = f"kinesis_actors patch of moto's Shard.{func.__name__} (per-shard lock, O(log n) index)."
        setattr(shard_cls, func.__name__, func)
    setattr(shard_cls, _PATCH_MARK, True)


def _indexed_storage(orig_init: Callable[..., None]) -> tuple[Callable[..., None], property]:
    """A ``Shard.__init__`` that sets up the index (lock, records, sorted sequence numbers,
    running max of arrivals), and a ``records`` property whose setter rebuilds the index."""

    @functools.wraps(orig_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        # Set before moto's __init__, whose ``self.records = OrderedDict()`` hits the setter.
        self._ka_lock = threading.Lock()
        self._ka_records = collections.OrderedDict()
        self._ka_seqs = []  # ascending sequence numbers (ints) of _ka_records
        self._ka_arrivals = []  # running max of Record.created_at, parallel to _ka_seqs
        orig_init(self, *args, **kwargs)

    def _get_records(self: Any) -> dict[int, Any]:
        records: dict[int, Any] = self._ka_records
        return records

    def _set_records(self: Any, value: dict[int, Any]) -> None:
        seqs = sorted(value)
        arrivals: list[Any] = []
        for seq in seqs:
            created = value[seq].created_at
            arrivals.append(max(arrivals[-1], created) if arrivals else created)
        with self._ka_lock:
            self._ka_records = value
            self._ka_seqs = seqs
            self._ka_arrivals = arrivals

    return __init__, property(_get_records, _set_records, doc="Records by sequence number (indexed).")


def _indexed_put_record(record_cls: Any) -> Callable[..., str]:
    """``Shard.put_record``: the next sequence number, appended to the index under the shard's lock."""

    def put_record(self: Any, partition_key: str, data: str, explicit_hash_key: str) -> str:
        with self._ka_lock:
            seqs = self._ka_seqs
            sequence_number = (seqs[-1] if seqs else 0) + 1
            record = record_cls(partition_key, data, sequence_number, explicit_hash_key)
            self._ka_records[sequence_number] = record
            seqs.append(sequence_number)
            arrivals = self._ka_arrivals
            arrivals.append(max(arrivals[-1], record.created_at) if arrivals else record.created_at)
        return str(sequence_number)

    return put_record


def _indexed_reads() -> tuple[Callable[..., Any], ...]:
    """``Shard.get_records`` and the sequence-number lookups, by bisection of the index."""

    def get_records(self: Any, last_sequence_id: str, limit: int | None) -> tuple[list[Any], int, int]:
        last_sequence_int = int(last_sequence_id)
        with self._ka_lock:
            seqs = self._ka_seqs
            start = bisect.bisect_right(seqs, last_sequence_int)
            end = len(seqs) if limit is None or limit <= 0 else min(len(seqs), start + limit)
            if start >= end:
                return [], last_sequence_int, 0
            by_seq = self._ka_records
            results = [by_seq[seq] for seq in seqs[start:end]]
            newest = by_seq[seqs[-1]]
        last = results[-1]
        millis_behind_latest = int(_seconds(newest.created_at - last.created_at) * 1000)
        return results, last.sequence_number, millis_behind_latest

    def get_min_sequence_number(self: Any) -> int:
        seqs = self._ka_seqs
        return seqs[0] if seqs else 0

    def get_max_sequence_number(self: Any) -> int:
        seqs = self._ka_seqs
        return seqs[-1] if seqs else 0

    def get_sequence_number_at(self: Any, at_timestamp: Any) -> int:
        # Stock: 0 when empty or at/before the first arrival, else the last record
        # that arrived strictly before at_timestamp.
        with self._ka_lock:
            idx = bisect.bisect_left(self._ka_arrivals, at_timestamp)
            return self._ka_seqs[idx - 1] if idx > 0 else 0

    return get_records, get_min_sequence_number, get_max_sequence_number, get_sequence_number_at


def _seconds(delta: Any) -> float:
    """A difference of two ``Record.created_at`` values in seconds: a ``timedelta``
    (moto >= 5.2.6, datetimes) or a number (earlier moto, epoch seconds)."""
    return float(delta.total_seconds()) if hasattr(delta, "total_seconds") else float(delta)


def _shift(created_at: Any, seconds: float) -> Any:
    """A ``Record.created_at`` value moved by ``seconds``, in the same type."""
    if isinstance(created_at, datetime.datetime):
        return created_at + datetime.timedelta(seconds=seconds)
    return created_at + seconds


def _self_test(models: Any) -> None:
    """Exercise the patched Shard once; raise MotoPatchError if it misbehaves."""
    shard_cls = models.Shard
    trackers = [getattr(cls, "instances_tracked", None) for cls in (shard_cls, models.Record)]
    sizes = [len(t) if isinstance(t, list) else None for t in trackers]
    shard = shard_cls(0, 0, 2**128 - 1)
    try:
        seqs = [shard.put_record(f"pk{i}", "AA==", None) for i in range(3)]
        records, last, _ = shard.get_records("0", 2)
        ok = (
            seqs == ["1", "2", "3"]
            and [r.sequence_number for r in records] == [1, 2]
            and last == 2
            and [r.sequence_number for r in shard.get_records("2", None)[0]] == [3]
            and shard.get_records("3", 5)[:2] == ([], 3)
            and (shard.get_min_sequence_number(), shard.get_max_sequence_number()) == (1, 3)
            and shard.get_sequence_number_at(_shift(shard.records[1].created_at, -1.0)) == 0
            and shard.get_sequence_number_at(_shift(shard.records[3].created_at, 1.0)) == 3
            and list(shard.records) == [1, 2, 3]
        )
        shard.records = collections.OrderedDict()
        ok = ok and shard.get_max_sequence_number() == 0 and shard.put_record("pk", "AA==", None) == "1"
    except Exception as exc:
        raise MotoPatchError(f"self-test of the patched moto Shard failed: {exc!r}") from exc
    finally:
        # Do not leave the throwaway objects in moto's instance tracker (/moto-api/data.json);
        # this runs before the server starts, so nothing else appended meanwhile.
        for tracked, size in zip(trackers, sizes):
            if isinstance(tracked, list) and size is not None:
                del tracked[size:]
    if not ok:
        raise MotoPatchError("self-test of the patched moto Shard returned unexpected results")


def patch_moto() -> None:
    """Patch moto's Kinesis Shard in this process (idempotent; see the module docstring).

    Raises:
        MotoPatchError: moto is not installed or its internals changed shape.
    """
    try:
        import moto
        from moto.kinesis import models
    except ImportError as exc:
        raise MotoPatchError(f"moto is not installed ({exc}); pip install 'kinesis-actors[emulator]'") from exc
    if getattr(models.Shard, _PATCH_MARK, False):
        return
    version = getattr(moto, "__version__", "?")
    if not str(version).startswith("5.2."):  # pyproject's extras pin the 5.2 releases CI runs
        log.warning("moto %s: the emulator patch was written for moto 5.2.5-5.2.6; the self-test decides", version)
    check_moto_shape(models)
    _install_shard_patch(models)
    _self_test(models)
    _install_get_records_body(models)
    _install_dynamodb_lock()
    log.info("patched moto %s: Kinesis Shard (per-shard lock, indexed sequence numbers), GetRecords body, "
             "DynamoDB (atomic conditional writes)", version)


def _install_get_records_body(models: Any) -> None:
    """Write ``GetRecords`` bodies directly (:mod:`.get_records_body`) once they match moto's own
    serializer on records with bytes and str payloads, sub-millisecond arrivals and a null
    iterator.

    Raises:
        MotoPatchError: the bodies differ, or moto's serializer changed shape.
    """
    from moto.kinesis import responses

    from .get_records_body import body_matches_stock, install_get_records_body

    shard = models.Shard(0, 0, 2**128 - 1)
    for i, data in enumerate((b"\x00\xffbytes", "c3Ry", b"")):
        shard.put_record(f"key-{i}", data, None)
    records = [shard.records[n] for n in sorted(shard.records)]
    try:
        same = body_matches_stock(records, "iterator", 1234) and body_matches_stock([], None, 0)
    except Exception as exc:  # moto's serializer API moved: refuse to serve rather than guess
        raise MotoPatchError(f"GetRecords body self-test could not run on this moto: {exc!r}") from exc
    if not same:
        raise MotoPatchError("GetRecords body self-test: the direct body differs from moto's serializer")
    install_get_records_body(responses)


_DYNAMODB_LOCKED = (
    "get_item", "put_item", "update_item", "delete_item", "scan", "query", "batch_get_item",
    "batch_write_item", "transact_get_items", "transact_write_items", "create_table", "delete_table",
)


def _install_dynamodb_lock() -> None:
    """Make moto's DynamoDB condition-check-then-write atomic: one lock around item operations."""
    from moto.dynamodb.models import DynamoDBBackend

    missing = [name for name in _DYNAMODB_LOCKED if not callable(getattr(DynamoDBBackend, name, None))]
    if missing:
        raise MotoPatchError(f"moto's DynamoDBBackend lacks {missing}: the emulator patch needs updating")
    lock = threading.RLock()

    def locked(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with lock:
                return func(*args, **kwargs)

        return wrapper

    for name in _DYNAMODB_LOCKED:
        setattr(DynamoDBBackend, name, locked(getattr(DynamoDBBackend, name)))
