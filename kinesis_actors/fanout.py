"""Enhanced fan-out (EFO): :class:`FanOutFetcher`, the second read path of a shard
(``SubscribeToShard``).

Four modules, one role each: this one (the fetcher), :mod:`~kinesis_actors.fanout_events`
(the messages: :class:`SubscriptionEvent`, :func:`parse_event_payload`, the frames and the
request's ``StartingPosition``), :mod:`~kinesis_actors.fanout_http` (the transport:
:class:`HttpSubscriber`, :class:`EventSource`, :data:`Subscribe`) and
:mod:`~kinesis_actors.fanout_consumer` (the stream consumer: :func:`ensure_stream_consumer`,
:func:`deregister_stream_consumer`); every name stays importable from here.

:class:`FanOutFetcher` sits behind the same seam as
:class:`~kinesis_actors.kinesis.ShardFetcher`: :meth:`~FanOutFetcher.step` returns
:class:`~kinesis_actors.kinesis.Fetched` batches (one per ``SubscribeToShardEvent``),
:meth:`~FanOutFetcher.due_in` says how long to wait, :attr:`~FanOutFetcher.position` is
where the next subscription opens. The read loop of a lease
(:class:`~kinesis_actors.reader.ShardConsumer`) drives either one.

Wire format and transport. ``SubscribeToShard`` answers with an HTTP response whose
body is a stream of AWS event-stream frames (``application/vnd.amazon.eventstream``).
botocore builds, serialises and signs the request (endpoint resolution, SigV4, the
credential chain, exactly as for any other call); :class:`HttpSubscriber` then sends
that signed request itself over urllib3 (botocore's own HTTP library) and decodes the
body with ``botocore.eventstream.EventStreamBuffer``, the frame decoder boto3 uses
(prelude, headers, payload and both CRC32 checks). It does not use boto3's
``subscribe_to_shard`` response parser because that parser requires the first event to
be ``initial-response``, which AWS sends and kinesis-mock (the offline emulator we test
on) does not; an ``initial-response`` event is skipped when it comes. We do not write a
frame parser of our own: botocore's is the one AWS maintains and fixes.

HTTP/1.1 and HTTP/2. boto3 and urllib3 speak HTTP/1.1, so each subscription holds one
TCP connection, and flow control is TCP's: while the read loop does not read (its
downstream holds a batch), events wait in the socket buffers and AWS's writes slow
down. AWS documents ``SubscribeToShard`` for HTTP/2 (KCL uses Netty's HTTP/2 client,
and its maintainers call HTTP/1.1 unsupported); kinesis-mock serves HTTP/1.1. The
transport is one seam, :data:`Subscribe` (``params -> EventSource``): moving to HTTP/2
means another :data:`Subscribe` that sends the same signed request with an HTTP/2
client (e.g. ``httpx`` with ``http2=True`` or ``h2``) and returns its body chunks; the
frame decoding, positions and error handling here stay as they are, and subscriptions
of one process would then share one connection.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any, Literal

from .backoff import Backoff
from .clock import monotonic_s
from .errors import InvalidError, aws_error_code, is_throttling
from .fanout_consumer import deregister_stream_consumer, ensure_stream_consumer
from .fanout_events import (
    EventRefused,
    SubscriptionEvent,
    complete_frames,
    decode_message,
    parse_event_payload,
    starting_position,
)
from .fanout_http import EventSource, HttpSubscriber, Subscribe
from .kinesis import Fetched, ShardPosition
from .records import StartAt, seq_key

__all__ = ["ensure_stream_consumer", "deregister_stream_consumer", "FanOutFetcher", "HttpSubscriber", "EventSource",
           "Subscribe", "SubscriptionEvent", "parse_event_payload", "MIN_SUBSCRIBE_SPACING_S",
           "SUBSCRIPTION_RENEW_S", "FANOUT_EVENT_RESERVE_BYTES", "SUBSCRIBE_BACKOFF"]

log = logging.getLogger(__name__)

MIN_SUBSCRIBE_SPACING_S = 1.0
"""Shortest gap between two ``SubscribeToShard`` calls on one shard, seconds: AWS allows one
call per second per shard and consumer (``LimitExceededException`` beyond)."""

SUBSCRIBE_BACKOFF = Backoff(base_s=MIN_SUBSCRIBE_SPACING_S, cap_s=5.0, floor_s=MIN_SUBSCRIBE_SPACING_S)
"""Waits before a new ``SubscribeToShard`` after a refused or lost one, seconds: full jitter
from :data:`MIN_SUBSCRIBE_SPACING_S` up to 5 s."""

SUBSCRIPTION_RENEW_S = 290.0
"""Age at which an open subscription is renewed, seconds. AWS ends a subscription after 5
minutes; renewing 10 s earlier, at the next event, keeps the renewal ours (from the last
delivered ``ContinuationSequenceNumber``) rather than the service's. A subscription that
ends earlier (the service closed it) is renewed the same way."""

FANOUT_EVENT_RESERVE_BYTES = 2 * 2**20
"""What one event read reserves in the reader's byte budget, bytes: 2 MiB, the data AWS
pushes to one consumer per shard and second at EFO's documented rate (2 MB/s). An event
that carries more is still taken and counted in full."""

_RETRY_CODES = frozenset({"ResourceInUseException", "LimitExceededException", "InternalFailure",
                          "InternalFailureException", "ServiceUnavailable"})


# --------------------------------------------------------------------------- the fetcher
class FanOutFetcher(ShardPosition):
    """Reads one shard through enhanced fan-out: one ``SubscribeToShard`` at a time, renewed.

    The same contract as :class:`~kinesis_actors.kinesis.ShardFetcher`: :meth:`step` does
    one blocking thing (open a subscription, or read its next event, waiting at most the
    read timeout) and never sleeps; :meth:`due_in` is the wait before the next step; the
    caller waits (the read loop with ``asyncio``).

    Rules:

    * Position: the first subscription opens at the start position; every later one
      (renewal, a dropped connection, a refusal) opens ``AFTER_SEQUENCE_NUMBER`` of the last
      delivered ``ContinuationSequenceNumber``, or after the last record returned when it
      is later, never at an older point. Before any event was returned, a retry opens at
      ``restart_at`` (a ``LATEST`` start reopens at the ``AT_TIMESTAMP`` recorded, never at
      a later tip). A position inside a KPL aggregate re-reads it (``AT_SEQUENCE_NUMBER``)
      and drops the user records already returned.
    * A subscription counts as open (:attr:`has_iterator`) once its first frame arrived
      and was not an exception: HTTP 200 alone is not acceptance (kinesis-mock answers
      200, then sends ``ResourceInUseException`` as the first frame; AWS sends
      ``initial-response`` first).
    * Events are returned whole, in order, one per :meth:`step`; frames are decoded by
      ``EventStreamBuffer`` and only complete ones are used, so a connection that drops in
      the middle of an event loses nothing: the next subscription starts after the last
      event returned.
    * Renewal: a subscription older than ``renew_after_s`` is ended at the next step and
      reopened from the position; one the service ends (AWS: after 5 minutes) likewise.
    * ``ResourceInUseException`` (the previous subscription of this consumer and shard is
      still open on the service side), ``LimitExceededException`` (more than one
      ``SubscribeToShard`` per second), throttling, 5xx, network errors, a read timeout:
      exponential backoff with full jitter (:data:`SUBSCRIBE_BACKOFF`, at least
      ``MIN_SUBSCRIBE_SPACING_S``), then a new subscription. Subscriptions on one shard are
      never closer than :data:`MIN_SUBSCRIBE_SPACING_S`.
    * Shard end: an event with ``ChildShards``, or without ``ContinuationSequenceNumber``,
      or (emulators) reaching a closed shard's ``EndingSequenceNumber``, is returned with
      ``shard_end=True``; the caller writes ``SHARD_END`` once it acknowledged it.
    * :meth:`close` ends the subscription at once, from any thread (a lost lease).

    Args:
        client: a boto3 Kinesis client (signs requests). stream: the stream name.
        shard_id: the shard. start: where to open when nothing was returned yet.
        consumer_arn: the registered stream consumer (:func:`ensure_stream_consumer`).
        restart_at: where to reopen before the first event (default ``start``).
        ending_sequence_number: a closed shard's ``EndingSequenceNumber``, or None.
        subscribe: the transport (default :class:`HttpSubscriber` over ``client``; a
            client with an ``open_subscription`` method, such as
            :class:`kinesis_actors.testing.FakeKinesis`, is its own transport).
        renew_after_s: see :data:`SUBSCRIPTION_RENEW_S`.
        clock: monotonic seconds. rng: uniform [0, 1) for the backoff jitter.

    Raises (from :meth:`step`):
        StreamError: the stream, shard or consumer does not exist
            (``ResourceNotFoundException``), or the credentials were refused.
        KinesisError: any other error that is not transient, translated, cause chained.
    """

    def __init__(self, client: Any, stream: str, shard_id: str, start: StartAt, *, consumer_arn: str,
                 restart_at: StartAt | None = None, ending_sequence_number: str | None = None,
                 subscribe: Subscribe | None = None, renew_after_s: float = SUBSCRIPTION_RENEW_S,
                 clock: Callable[[], float] = monotonic_s, rng: Callable[[], float] = random.random) -> None:
        if not consumer_arn:
            raise InvalidError("FanOutFetcher needs a consumer_arn")
        super().__init__(stream, shard_id, start, restart_at, ending_sequence_number)
        self.client = client
        self.consumer_arn = consumer_arn
        self.renew_after_s = renew_after_s
        if subscribe is None:
            subscribe = getattr(client, "open_subscription", None) or HttpSubscriber(client)
        self._subscribe: Subscribe = subscribe
        self._clock = clock
        self._rng = rng
        self._continuation: str | None = None
        self._source: EventSource | None = None
        self._confirmed = False  # the subscription's first frame arrived and was not a refusal
        self._pending: Any = None  # that first frame, when it was an event: returned by the next step
        self._frames: Iterator[Any] | None = None
        self._opened_at = 0.0
        self._next_call_at = 0.0
        self._last_subscribe = float("-inf")
        self._lock = threading.Lock()
        self._closed = False
        self.throttled_in_a_row = 0
        self.subscriptions = 0  # SubscribeToShard calls confirmed (first frame not a refusal)
        self.subscribe_calls = 0
        self.events = 0
        self.renewals = 0
        self.drops = 0  # subscriptions lost to a dropped connection, a timeout or an exception event
        self.throttles = 0
        self.get_records_calls = 0  # the polling fetcher's counter; always 0 here
        self.expired_iterators = 0  # likewise

    # -- the seam shared with ShardFetcher
    @property
    def position(self) -> StartAt:
        """Where the next subscription opens (see the class docstring)."""
        last, continuation = self._last, self._continuation
        if continuation is not None and (last is None or seq_key(continuation) > seq_key(last.sequence_number)):
            return StartAt.after_sequence_number(continuation)
        if last is not None:
            return StartAt.after_sequence_number(last.sequence_number, last.sub_sequence_number)
        return self._start

    @property
    def has_iterator(self) -> bool:
        """True while a subscription is open and confirmed: its first frame arrived and was
        not a refusal (the next step returns an event)."""
        return self._source is not None and self._confirmed

    @property
    def blocking_read(self) -> bool:
        """True when the next step reads the subscription (waits for a frame)."""
        return self._source is not None

    def seek(self, position: StartAt) -> None:
        """End the subscription and forget everything returned: the next step opens at ``position``."""
        self._drop()
        self._start = self._restart = position
        self._last, self._continuation = None, None

    def due_in(self) -> float:
        """Seconds until the next :meth:`step` may subscribe (0 when it may now, or reads)."""
        if self._source is not None:
            return 0.0
        return max(0.0, self._next_call_at - self._clock())

    def close(self) -> None:
        """End the subscription now, from any thread; a step in progress returns None."""
        with self._lock:
            self._closed = True
        self._drop()

    def reopen(self) -> None:
        """Undo :meth:`close`: the next step subscribes again (after a pause for backpressure)."""
        with self._lock:
            self._closed = False

    def pause(self) -> bool:
        """Drop the subscription (backpressure); the next step resubscribes from :attr:`position`.
        True (the reader's Fetcher protocol: something was dropped)."""
        if self._source is not None:
            log.info("%s: byte budget full; subscription dropped, resubscribing after the last acknowledged "
                     "record", self.resource)
        self._drop()
        return True

    # -- the reader's Fetcher protocol (kinesis_actors.reader.fetcher)
    reserve_bytes: int | None = FANOUT_EVENT_RESERVE_BYTES
    """Byte-budget reservation of one step (one event), bytes."""

    @property
    def io_kind(self) -> Literal["stream", "open"]:
        """``"stream"`` while a subscription is open (the step waits for its next event), else
        ``"open"`` (``SubscribeToShard``: at most once per second per shard)."""
        return "stream" if self._source is not None else "open"

    def counters(self) -> dict[str, int]:
        """The polling counters (0 here but ``throttles``) and ``subscriptions``,
        ``subscription_renewals``, ``subscription_drops``."""
        return {"get_records_calls": self.get_records_calls, "throttles": self.throttles,
                "expired_iterators": self.expired_iterators, "subscriptions": self.subscriptions,
                "subscription_renewals": self.renewals, "subscription_drops": self.drops}

    # -- internals
    def _drop(self) -> None:
        with self._lock:
            source, self._source, self._frames = self._source, None, None
            self._confirmed, self._pending = False, None
        if source is not None:
            source.close()

    def _backoff(self, e: BaseException, what: str) -> None:
        self.throttles += 1
        self.throttled_in_a_row += 1
        pause = SUBSCRIBE_BACKOFF.delay_s(self.throttled_in_a_row, rng=self._rng)
        self._next_call_at = max(self._next_call_at, self._clock() + pause)
        log.info("%s on %s: %s; next subscription in %.2f s", what, self.resource,
                 aws_error_code(e) or type(e).__name__, pause)

    def _fatal(self, e: BaseException) -> Exception:
        return self.not_found(e, "SubscribeToShard",
                               f"stream {self.stream!r}, shard {self.shard_id} or its stream consumer")

    @staticmethod
    def _transient(e: BaseException) -> bool:
        """A refusal or failure a later subscription may overcome (retried with backoff)."""
        code = aws_error_code(e)
        if code is not None:
            return code in _RETRY_CODES or is_throttling(e)
        import urllib3

        # no AWS code: a network error (refused, reset, timed out); not missing credentials
        return is_throttling(e) or isinstance(e, (urllib3.exceptions.HTTPError, OSError))

    def _open(self) -> None:
        from botocore.eventstream import EventStreamBuffer

        position = self.position
        self.arm_skip(position)
        self._last_subscribe = now = self._clock()
        self._next_call_at = now + MIN_SUBSCRIBE_SPACING_S
        self.subscribe_calls += 1
        try:
            source = self._subscribe({"ConsumerARN": self.consumer_arn, "ShardId": self.shard_id,
                                      "StartingPosition": starting_position(position)})
        except Exception as e:
            if not self._transient(e):
                raise self._fatal(e) from e
            self._backoff(e, "SubscribeToShard refused or failed")
            return
        with self._lock:
            if self._closed:
                source.close()
                return
            self._source, self._frames = source, complete_frames(source, EventStreamBuffer())
        self._opened_at = self._clock()
        log.debug("%s: subscribed at %s", self.resource, position)

    def step(self) -> Fetched | None:
        """Subscribe when no subscription is open, else read its next event.

        Blocking (a socket read, at most the read timeout); never sleeps: wait
        :meth:`due_in` seconds before it.

        Returns:
            A :class:`~kinesis_actors.kinesis.Fetched` for an event (possibly with no
            records), or None when the step subscribed, confirmed a subscription (its
            first frame), renewed, or handled a refusal, a dropped connection or the end
            of a subscription (step again).

        Raises:
            StreamError, KinesisError: see the class docstring.
        """
        if self._source is None:
            if not self._closed:
                self._open()
            return None
        if self._pending is not None:
            message, self._pending = self._pending, None
            return self._event(message)
        if self._clock() - self._opened_at >= self.renew_after_s:
            self.renewals += 1
            log.info("%s: renewing the subscription at %s", self.resource, self.position)
            self._drop()
            return None
        frames = self._frames
        assert frames is not None
        try:
            message = next(frames, None)
        except Exception as e:
            if self._closed or self._source is None:
                return None  # closed from another thread (lost lease, stop)
            self.drops += 1
            self._drop()
            self._backoff(e, "subscription dropped")
            return None
        if message is None:  # the service ended the subscription (AWS: after 5 minutes)
            self.renewals += 1
            self._drop()
            log.info("%s: subscription ended by the service; resubscribing at %s", self.resource, self.position)
            return None
        if not self._confirmed:
            # HTTP 200 is not acceptance: kinesis-mock answers 200 and then sends
            # ResourceInUseException as the first frame. The first frame decides.
            if message.headers.get(":message-type") != "event":
                return self._event(message)  # a refusal: dropped, backed off
            self._confirmed = True
            self.subscriptions += 1
            self.throttled_in_a_row = 0
            if message.headers.get(":event-type") == "SubscribeToShardEvent":
                self._pending = message  # returned by the next step (the caller was only opening)
            return None
        return self._event(message)

    def _event(self, message: Any) -> Fetched | None:
        try:
            event = decode_message(message, shard_id=self.shard_id, stream=self.stream)
        except EventRefused as err:
            self.drops += 1
            self._drop()
            if not self._transient(err):
                raise self._fatal(err) from err
            self._backoff(err, "exception event")
            return None
        if event is None:
            return None  # initial-response (AWS) and events this version does not know
        self.events += 1
        records = self.accept(event.records)
        self._continuation = event.continuation_sequence_number
        lag = event.millis_behind_latest
        at_tip = not event.records and not lag
        shard_end = bool(event.child_shards) or event.continuation_sequence_number is None or self.past_end(at_tip)
        if shard_end:
            self._drop()
        return Fetched(records, lag, shard_end, at_tip, records.nbytes)
