"""One shard's batch as one compact object: :class:`RecordBatch`.

A batch crosses from a reader to a sink actor, the pull queue (and the driver) or a
Dataset window as ONE object of contiguous buffers (SPEC, "Batches that cross process
boundaries"): the payloads back to back in one ``bytes`` with int32 offsets, the
partition keys and sequence numbers likewise (UTF-8 / ASCII), the arrival times as one
float64 array of epoch seconds, the KPL sub-sequences (and explicit hash keys) only when
the batch holds KPL user records. Pickling it (Ray's serialisation of an actor call's
argument) copies a handful of buffers, never one object per record.

What user code sees is a ``Sequence[Record]``: ``len()``, indexing (negative too),
slices (a ``RecordBatch`` again), iteration, and equality with any sequence of records
(``batch == []`` when empty). :class:`~kinesis_actors.records.Record` objects are built
when they are read, not before; ``to_arrow()`` gives a ``pyarrow.RecordBatch`` with
:data:`~kinesis_actors.arrow.RECORD_SCHEMA` whose ``data`` column wraps the payload
buffer without copying it.
"""

from __future__ import annotations

import itertools
import math
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

from .records import Record, seq_key

__all__ = ["RecordBatch", "payload_bytes"]

_NO_SUB = -1  # sub-sequence column value of a record that is not a KPL user record


def _offsets(lengths: Iterable[int]) -> array[int]:
    return array("i", itertools.accumulate(lengths, initial=0))


def _pack_str(values: Sequence[str]) -> tuple[bytes, array[int]]:
    """Strings as one UTF-8 buffer and its offsets (ASCII strings encode in one pass)."""
    joined = "".join(values)
    if joined.isascii():
        return joined.encode("ascii"), _offsets(map(len, values))
    parts = [v.encode("utf-8") for v in values]
    return b"".join(parts), _offsets(map(len, parts))


class RecordBatch(Sequence[Record]):
    """Records of one shard in sequence order, held as columns (see the module docstring).

    Build one with :meth:`from_columns` (the wire parser), :meth:`from_records` or
    :meth:`empty`; the constructor takes the packed buffers as they travel.

    Attributes:
        shard_id: the shard. stream: the stream name.
    """

    __slots__ = (
        "_arrival",
        "_cache",
        "_data",
        "_data_off",
        "_ehk",
        "_pk",
        "_pk_off",
        "_seq",
        "_seq_off",
        "_sub",
        "shard_id",
        "stream",
    )

    def __init__(self, shard_id: str, stream: str, data: bytes, data_off: array[int], pk: bytes, pk_off: array[int],
                 seq: bytes, seq_off: array[int], arrival: array[float], sub: array[int] | None = None,
                 ehk: tuple[str | None, ...] | None = None) -> None:
        self.shard_id = shard_id
        self.stream = stream
        self._data, self._data_off = data, data_off
        self._pk, self._pk_off = pk, pk_off
        self._seq, self._seq_off = seq, seq_off
        self._arrival = arrival
        self._sub = sub
        self._ehk = ehk
        self._cache: list[Record] | None = None

    # ------------------------------------------------------------------ building
    @classmethod
    def empty(cls, shard_id: str = "", stream: str = "") -> RecordBatch:
        """A batch of no records."""
        zero = array("i", [0])
        return cls(shard_id, stream, b"", zero, b"", zero, b"", zero, array("d"))

    @classmethod
    def from_columns(cls, shard_id: str, stream: str, data: Sequence[bytes], partition_keys: Sequence[str],
                     sequence_numbers: Sequence[str], arrivals: Sequence[float | None]) -> RecordBatch:
        """A batch of plain (not KPL) records from their columns; ``arrivals`` are epoch
        seconds (None where the service left the timestamp out)."""
        pk, pk_off = _pack_str(partition_keys)
        seq = "".join(sequence_numbers).encode("ascii")
        nan = math.nan
        return cls(shard_id, stream, b"".join(data), _offsets(map(len, data)), pk, pk_off, seq,
                   _offsets(map(len, sequence_numbers)),
                   array("d", [nan if a is None else a for a in arrivals]))

    @classmethod
    def from_records(cls, records: Sequence[Record], *, shard_id: str | None = None,
                     stream: str | None = None) -> RecordBatch:
        """A batch holding ``records`` (all of one shard; ``shard_id``/``stream`` default to
        the first record's). A ``RecordBatch`` is returned as it is."""
        if isinstance(records, RecordBatch):
            return records
        if not records:
            return cls.empty(shard_id or "", stream or "")
        first = records[0]
        batch = cls.from_columns(shard_id or first.shard_id, stream or first.stream, [r.data for r in records],
                                 [r.partition_key for r in records], [r.sequence_number for r in records],
                                 [r.arrival_epoch_s for r in records])
        if any(r.sub_sequence_number is not None for r in records):
            batch._sub = array("q", [_NO_SUB if r.sub_sequence_number is None else r.sub_sequence_number
                                     for r in records])
            if any(r.explicit_hash_key is not None for r in records):
                batch._ehk = tuple(r.explicit_hash_key for r in records)
        batch._cache = list(records)
        return batch

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # The buffers only: Records built on one side are not shipped.
        return (RecordBatch, (self.shard_id, self.stream, self._data, self._data_off, self._pk, self._pk_off,
                              self._seq, self._seq_off, self._arrival, self._sub, self._ehk))

    # ------------------------------------------------------------------ Sequence
    def __len__(self) -> int:
        return len(self._arrival)

    def _record(self, i: int) -> Record:
        d, p, s = self._data_off, self._pk_off, self._seq_off
        arrival = self._arrival[i]
        sub = self._sub[i] if self._sub is not None else _NO_SUB
        return Record(self._data[d[i]:d[i + 1]], self._pk[p[i]:p[i + 1]].decode("utf-8"),
                      self._seq[s[i]:s[i + 1]].decode("ascii"), None if sub == _NO_SUB else sub,
                      None if arrival != arrival else arrival, self.shard_id, self.stream,
                      self._ehk[i] if self._ehk is not None else None)

    def records(self) -> list[Record]:
        """Every record as a :class:`~kinesis_actors.records.Record` (built once, then kept)."""
        if self._cache is None:
            self._cache = [self._record(i) for i in range(len(self))]
        return self._cache

    @overload
    def __getitem__(self, index: int) -> Record: ...

    @overload
    def __getitem__(self, index: slice) -> RecordBatch: ...

    def __getitem__(self, index: int | slice) -> Record | RecordBatch:
        n = len(self)
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step != 1:
                return RecordBatch.from_records(self.records()[index], shard_id=self.shard_id, stream=self.stream)
            return self._slice(start, max(start, stop))
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("RecordBatch index out of range")
        if self._cache is not None:
            return self._cache[index]
        return self._record(index)

    def _slice(self, start: int, stop: int) -> RecordBatch:
        if start == 0 and stop == len(self):
            return self

        def cut(blob: bytes, off: array[int]) -> tuple[bytes, array[int]]:
            base = off[start]
            return blob[base:off[stop]], array("i", [o - base for o in off[start:stop + 1]])

        data, data_off = cut(self._data, self._data_off)
        pk, pk_off = cut(self._pk, self._pk_off)
        seq, seq_off = cut(self._seq, self._seq_off)
        out = RecordBatch(self.shard_id, self.stream, data, data_off, pk, pk_off, seq, seq_off,
                          self._arrival[start:stop], None if self._sub is None else self._sub[start:stop],
                          None if self._ehk is None else self._ehk[start:stop])
        if self._cache is not None:
            out._cache = self._cache[start:stop]
        return out

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        if len(other) != len(self):
            return False
        return all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # a sequence compared by value, like a list

    def __repr__(self) -> str:
        return f"RecordBatch({len(self)} records of {self.stream}/{self.shard_id}, {len(self._data)} bytes of data)"

    # ------------------------------------------------------------------ columns
    @property
    def nbytes(self) -> int:
        """Bytes this batch holds in its buffers (payloads, keys, sequence numbers, offsets,
        arrival times, sub-sequences): what a byte budget counts for it."""
        n = len(self._data) + len(self._pk) + len(self._seq) + 4 * (3 * len(self) + 3) + 8 * len(self)
        return n + (8 * len(self) if self._sub is not None else 0)

    @property
    def payload_bytes(self) -> int:
        """Bytes of the records' data (payloads only)."""
        return len(self._data)

    def last_position(self) -> tuple[str, int | None]:
        """``(sequence number, sub-sequence or None)`` of the last record (the checkpoint
        of the batch), without building a Record.

        Raises:
            IndexError: the batch is empty.
        """
        n = len(self)
        if n == 0:
            raise IndexError("last_position of an empty RecordBatch")
        s = self._seq_off
        sub = self._sub[n - 1] if self._sub is not None else _NO_SUB
        return self._seq[s[n - 1]:s[n]].decode("ascii"), None if sub == _NO_SUB else sub

    def arrival_epoch_s(self, index: int) -> float | None:
        """Arrival time of record ``index`` as epoch seconds (None if absent)."""
        value = self._arrival[index]
        return None if value != value else value

    def after(self, position: tuple[int, int]) -> RecordBatch:
        """The records whose ``Record.position`` is after ``position`` (the batch is in order)."""
        n = len(self)
        s = self._seq_off
        i = 0
        while i < n:
            sub = self._sub[i] if self._sub is not None else _NO_SUB
            if (seq_key(self._seq[s[i]:s[i + 1]].decode("ascii")), sub) > position:
                break
            i += 1
        return self._slice(i, n)

    def first_arriving_after(self, bound_s: float) -> int:
        """Index of the first record that arrived after ``bound_s`` (epoch seconds), or
        ``len(self)``; records without an arrival time never end it."""
        for i, arrival in enumerate(self._arrival):
            if arrival > bound_s:  # NaN compares False
                return i
        return len(self)

    def to_arrow(self) -> Any:
        """This batch as a ``pyarrow.RecordBatch`` with :data:`~kinesis_actors.arrow.RECORD_SCHEMA`.

        The ``data``, ``partition_key`` and ``sequence_number`` columns wrap this batch's
        buffers (no copy); ``approximate_arrival_timestamp`` is truncated to milliseconds,
        as pyarrow truncates a ``datetime``.
        """
        from .arrow import batch_to_arrow

        return batch_to_arrow(self._columns())

    def _columns(self) -> dict[str, Any]:
        return {"n": len(self), "data": (self._data, self._data_off), "pk": (self._pk, self._pk_off),
                "seq": (self._seq, self._seq_off), "arrival": self._arrival, "sub": self._sub,
                "shard_id": self.shard_id, "stream": self.stream}


def payload_bytes(batch: Sequence[Record]) -> int:
    """Bytes of data (payloads) of a batch: a :class:`RecordBatch` or any sequence of records."""
    if isinstance(batch, RecordBatch):
        return batch.payload_bytes
    return sum(len(r.data) for r in batch)
