"""The delivery controls of one subscription: :class:`DeliveryOptions` and their checks.

They mirror the controls of AWS Lambda's event source mapping for Kinesis (the documentation's
"Delivery controls" page, docs/delivery-controls.md, sets each control beside Lambda's name):

=============================  ===================================================
``KinesisStream`` keyword       Lambda event source mapping parameter
=============================  ===================================================
``max_batch_records``           ``BatchSize``
``max_batch_bytes``             (Lambda's fixed 6 MB invocation payload)
``batch_window_s``              ``MaximumBatchingWindowInSeconds``
``max_sink_retries``            ``MaximumRetryAttempts``
``bisect_on_error``             ``BisectBatchOnFunctionError``
``max_record_age_s``            ``MaximumRecordAgeInSeconds``
``dead_letter``                 ``DestinationConfig.OnFailure``
``PartialBatchError``           ``FunctionResponseTypes=[ReportBatchItemFailures]``
``parallelization_factor``      ``ParallelizationFactor``
``record_filter``               ``FilterCriteria`` (a Python predicate, not a JSON pattern)
=============================  ===================================================

The checks here are pure (no AWS, no Ray) so that :class:`~kinesis_actors.config.KinesisStream`
and ``KinesisBroker.subscribe`` refuse bad values before any AWS call.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from ..errors import InvalidError
from ..records import Record

__all__ = ["DeliveryOptions", "MAX_PARALLELIZATION_FACTOR", "MAX_BATCH_WINDOW_S", "MAX_BATCH_RECORDS",
           "check_delivery_fields", "check_sink_mode", "check_picklable_filter"]

MAX_PARALLELIZATION_FACTOR = 10
"""Most batches in flight per shard (Lambda's ``ParallelizationFactor`` maximum)."""
MAX_BATCH_WINDOW_S = 300.0
"""Longest ``batch_window_s`` (Lambda's ``MaximumBatchingWindowInSeconds`` maximum, 300 s)."""
MAX_BATCH_RECORDS = 10_000
"""Most records per batch (Lambda's ``BatchSize`` maximum for Kinesis, and ``GetRecords``' ``Limit``)."""


@dataclasses.dataclass(frozen=True)
class DeliveryOptions:
    """How one shard's records reach the downstream (all picklable; travels in ``ReaderSpec``).

    Attributes:
        max_sink_retries: attempts after the first failed delivery before a record is given
            up (dead-lettered or ``SinkError``); Lambda's ``MaximumRetryAttempts``.
        dead_letter: a ``Publisher`` receiving one JSON document per given-up record, or None.
        max_batch_records: most records per batch; None: one ``GetRecords`` response
            (at most ``max_records``) per batch.
        max_batch_bytes: most bytes (payload + partition key) per batch; None: no limit. A
            single record larger than this is delivered alone.
        batch_window_s: how long one shard's records are gathered before delivery, seconds
            (0.0: delivered as fetched).
        bisect_on_error: split a batch still failing after its retries into halves, down to
            single records.
        max_record_age_s: records older than this (by ``approximate_arrival_timestamp``)
            when about to be delivered go to the dead letters instead, seconds; None: no limit.
        record_filter: ``Callable[[Record], bool]``; records it rejects are acknowledged
            without delivery. None: deliver everything.
        parallelization_factor: batches of one shard in flight at once (1-10), split by
            partition key, delivered in rounds (see :mod:`.parallel`).
    """

    max_sink_retries: int = 5
    dead_letter: Any = None
    max_batch_records: int | None = None
    max_batch_bytes: int | None = None
    batch_window_s: float = 0.0
    bisect_on_error: bool = False
    max_record_age_s: float | None = None
    record_filter: Callable[[Record], bool] | None = None
    parallelization_factor: int = 1

    def __post_init__(self) -> None:
        check_delivery_fields(self)

    def batch_limit(self, max_records: int) -> int:
        """Most records per batch given the ``GetRecords`` ``Limit`` ``max_records``."""
        return self.max_batch_records if self.max_batch_records is not None else max_records

    @property
    def gathers(self) -> bool:
        """True when records are gathered across ``GetRecords`` responses (a window is set)."""
        return self.batch_window_s > 0


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_delivery_fields(o: Any) -> None:
    """Check the delivery keywords of a ``KinesisStream`` or a :class:`DeliveryOptions`.

    Args:
        o: an object with the attributes of :class:`DeliveryOptions`.

    Raises:
        InvalidError: a value out of range (named in the message), or ``max_record_age_s``
            without ``dead_letter`` (an expired record must go somewhere).
    """
    if not _is_int(o.max_sink_retries) or o.max_sink_retries < 0:
        raise InvalidError(f"max_sink_retries must be an int >= 0, got {o.max_sink_retries!r}")
    if o.max_batch_records is not None and (not _is_int(o.max_batch_records)
                                            or not 1 <= o.max_batch_records <= MAX_BATCH_RECORDS):
        raise InvalidError(f"max_batch_records must be an int in 1..{MAX_BATCH_RECORDS} or None, "
                           f"got {o.max_batch_records!r}")
    if o.max_batch_bytes is not None and (not _is_int(o.max_batch_bytes) or o.max_batch_bytes <= 0):
        raise InvalidError(f"max_batch_bytes must be a positive int or None, got {o.max_batch_bytes!r}")
    w = o.batch_window_s
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) \
            or not 0 <= w <= MAX_BATCH_WINDOW_S:
        raise InvalidError(f"batch_window_s must be a number of seconds in 0..{MAX_BATCH_WINDOW_S:g}, got {w!r}")
    if not isinstance(o.bisect_on_error, bool):
        raise InvalidError(f"bisect_on_error must be a bool, got {o.bisect_on_error!r}")
    age = o.max_record_age_s
    if age is not None and (isinstance(age, bool) or not isinstance(age, (int, float)) or not math.isfinite(age)
                            or age <= 0):
        raise InvalidError(f"max_record_age_s must be a finite number of seconds > 0 or None, got {age!r}")
    if age is not None and o.dead_letter is None:
        raise InvalidError("max_record_age_s needs dead_letter=: a record too old to deliver goes to the dead "
                           "letters, never nowhere")
    if o.record_filter is not None and not callable(o.record_filter):
        raise InvalidError(f"record_filter must be a callable Record -> bool, got {o.record_filter!r:.80}")
    p = o.parallelization_factor
    if not _is_int(p) or not 1 <= p <= MAX_PARALLELIZATION_FACTOR:
        raise InvalidError(f"parallelization_factor must be an int in 1..{MAX_PARALLELIZATION_FACTOR}, got {p!r}")


def check_sink_mode(o: Any, sink: object) -> None:
    """Refuse controls that need a push sink when ``sink`` is None (pull mode).

    Pull mode hands the driver one batch at a time and acknowledges what the driver says
    (``ack(upto=i)``): it cannot split a batch the driver holds (``bisect_on_error``) nor
    hand out several batches of one shard at once (``parallelization_factor > 1``).

    Raises:
        InvalidError: ``bisect_on_error`` or ``parallelization_factor > 1`` with ``sink=None``.
    """
    if sink is not None:
        return
    if o.bisect_on_error:
        raise InvalidError("bisect_on_error needs a push sink (sink=an actor or a Sink); pull mode "
                           "(sink=None) acknowledges with sub.ack(upto=i) instead")
    if o.parallelization_factor > 1:
        raise InvalidError(f"parallelization_factor={o.parallelization_factor} needs a push sink; pull mode "
                           "(sink=None) hands out one batch per shard at a time")


def check_picklable_filter(record_filter: Callable[[Record], bool] | None) -> None:
    """Check that Ray can ship ``record_filter`` to the readers (cloudpickle, as Ray does).

    Raises:
        InvalidError: cloudpickle cannot serialise it (e.g. it closes over a lock or a socket).
    """
    if record_filter is None:
        return
    from ray import cloudpickle  # the serializer Ray uses for actor arguments

    dumps: Callable[[object], bytes] = cloudpickle.dumps
    try:
        dumps(record_filter)
    except Exception as e:
        raise InvalidError(f"record_filter {record_filter!r:.80} cannot be serialised for the readers: "
                           f"{e!r:.200}") from e
