"""Delivery controls (Lambda's event source mapping for Kinesis, outside Lambda).

* :mod:`.options`: :class:`DeliveryOptions` and the checks of the ``KinesisStream`` keywords.
* :mod:`.dead_letter`: the per-record dead-letter document and :class:`DeadLetterWriter`.
* :mod:`.gather`: :class:`BatchGatherer` (batch size, bytes, window).
* :mod:`.engine`: :class:`DeliveryEngine` (retries, partial acknowledgement, bisection,
  maximum record age, filter) and :class:`OneLane` (a shard's batches one at a time).
* :mod:`.parallel`: :class:`ShardPipeline` and :class:`AckTracker` (batches in flight per
  shard, by partition key, in rounds; the checkpoint below which everything is acknowledged),
  and :class:`Lanes`, what the reader's read loop drives (:class:`ShardPipeline` or :class:`OneLane`).

All of it is plain code with injected sink calls, clocks and sleeps; the reader wires it.
"""

from .dead_letter import DeadLetterWriter, dead_letter_document
from .engine import DeliveryEngine, DeliveryResult, OneLane, partial_failed_from
from .gather import BatchGatherer, record_size
from .options import DeliveryOptions, check_picklable_filter, check_sink_mode
from .parallel import AckTracker, Lanes, ShardPipeline

__all__ = ["DeliveryOptions", "check_sink_mode", "check_picklable_filter", "DeadLetterWriter", "dead_letter_document",
           "BatchGatherer", "record_size", "DeliveryEngine", "DeliveryResult", "partial_failed_from", "AckTracker",
           "ShardPipeline", "Lanes", "OneLane"]
