"""A cheaper ``GetRecords`` response body for the emulator's moto (applied with the other patches).

moto 5.2 serialises every response through its generic, model-driven serializer, which
walks the botocore shape of each member of each record. For ``GetRecords`` that is
most of the emulator's CPU, and every CPU second moto spends is taken from the code under
test on the same machine (figures: ``bench/DESIGN_FIGURES.md``).
The patched ``KinesisResponse.get_records`` asks the same backend call for the same
records and writes the JSON document itself: the same members, the same values (``Data``
base64, ``SequenceNumber`` a string, ``ApproximateArrivalTimestamp`` epoch seconds
truncated to milliseconds by moto's own ``TimestampSerializer``, ``NextShardIterator``
left out when null, ``MillisBehindLatest``), the ``application/x-amz-json-1.1`` content
type. Errors are untouched: the backend raises moto's ``ServiceException``s, which moto
turns into error responses as before. A request in another protocol (CBOR) takes moto's
own path. :func:`body_matches_stock` compares the two bodies for the same records.

Three more costs per record go: moto's ``TimestampSerializer`` per arrival time
(:func:`unix_timestamp` is the same arithmetic on the datetime moto stores),
``json.dumps`` (msgspec, already our dependency, writes the same document), and the
regular expression moto runs over every response body to fill in an XML ``<RequestId>``
(a JSON body holds none, so the patched ``_enrich_response`` sets the headers as moto
does and leaves the body as it is).
"""

from __future__ import annotations

import binascii
import datetime as _dt
import inspect
import json
from typing import Any

import msgspec

__all__ = ["install_get_records_body", "get_records_document", "body_matches_stock", "unix_timestamp", "encode_body"]

_PATCH_MARK = "_kinesis_actors_fast_body"
CONTENT_TYPE = "application/x-amz-json-1.1"


_EPOCH = _dt.datetime(1970, 1, 1)
_SECOND = _dt.timedelta(seconds=1)


def _moto_timestamp(value: Any) -> Any:
    from moto.core.serialize import TimestampSerializer

    unix = TimestampSerializer.TIMESTAMP_FORMAT_UNIX
    return TimestampSerializer(unix)._convert_timestamp_to_str(value, unix)


def unix_timestamp(value: Any) -> int | float:
    """What moto's ``TimestampSerializer`` writes for an arrival time in the unix format: whole
    epoch seconds of the UTC datetime, plus its milliseconds (microseconds truncated) when it
    has any. A naive datetime (what moto's ``utcnow`` returns) is UTC; anything else goes
    through moto's serializer itself."""
    if not isinstance(value, _dt.datetime):
        return _moto_timestamp(value)  # type: ignore[no-any-return]
    if value.tzinfo is not None:
        value = value.astimezone(_dt.timezone.utc).replace(tzinfo=None)
    seconds: int = (value - _EPOCH) // _SECOND  # calendar.timegm(value.timetuple()), exactly
    return seconds + (value.microsecond // 1000) / 1000.0 if value.microsecond else seconds


def get_records_document(records: list[Any], next_iterator: str | None, millis_behind: int | None) -> dict[str, Any]:
    """The ``GetRecords`` response document for moto ``Record``s, as moto's JSON serializer writes it."""
    b64 = binascii.b2a_base64
    doc: dict[str, Any] = {"Records": [
        {"SequenceNumber": str(r.sequence_number), "ApproximateArrivalTimestamp": unix_timestamp(r.created_at),
         "Data": b64(r.data.encode() if isinstance(r.data, str) else r.data, newline=False).decode("ascii"),
         "PartitionKey": r.partition_key}
        for r in records]}
    if next_iterator is not None:
        doc["NextShardIterator"] = next_iterator
    if millis_behind is not None:
        doc["MillisBehindLatest"] = millis_behind
    return doc


def encode_body(doc: dict[str, Any]) -> str:
    """``doc`` as JSON text: msgspec's encoder, or ``json.dumps`` (moto's) for a document
    msgspec refuses: a partition key holding a lone surrogate (a JSON ``PutRecord`` may send
    ``"\\ud800"``, and moto stores it as it came), which ``json.dumps`` escapes.

    Raises:
        TypeError: a value of a type neither encoder supports (:func:`get_records_document`
            builds none).
    """
    try:
        return msgspec.json.encode(doc).decode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(doc)


def install_get_records_body(responses: Any) -> None:
    """Patch ``responses.KinesisResponse.get_records`` and ``_enrich_response`` (moto's
    ``moto.kinesis.responses``; once)."""
    cls = responses.KinesisResponse
    if getattr(cls, _PATCH_MARK, False):
        return
    stock = cls.get_records
    stock_enrich = cls._enrich_response  # a staticmethod (headers, body) in moto 5.2

    def _enrich_response(headers: Any, body: Any) -> Any:
        if isinstance(body, str) and "<RequestId>" not in body:  # moto's substitution would find nothing
            headers, _ = stock_enrich(headers, "")
            return headers, body
        return stock_enrich(headers, body)

    def get_records(self: Any) -> Any:
        if "cbor" in str(self.headers.get("Content-Type", "")).lower():
            return stock(self)
        next_iterator, records, millis_behind = self.kinesis_backend.get_records(
            self._get_param("StreamARN"), self._get_param("ShardIterator"), self._get_param("Limit"))
        body = encode_body(get_records_document(records, next_iterator, millis_behind))
        return 200, {"Content-Type": CONTENT_TYPE}, body

    get_records.__qualname__ = "KinesisResponse.get_records"
    get_records.__doc__ = "kinesis_actors patch of moto's KinesisResponse.get_records (a direct JSON body)."
    cls.get_records = get_records
    if isinstance(inspect.getattr_static(cls, "_enrich_response"), staticmethod):  # else moto changed: keep its own
        cls._enrich_response = staticmethod(_enrich_response)
    setattr(cls, _PATCH_MARK, True)


def body_matches_stock(records: list[Any], next_iterator: str | None, millis_behind: int | None) -> bool:
    """True if :func:`get_records_document` equals what moto's own JSON serializer makes of the
    same ``GetRecords`` result (parsed JSON compared), the check the emulator's self-test runs."""
    from moto.core.serialize import XFormedAttributePicker, get_serializer_class
    from moto.core.utils import get_service_model
    from moto.kinesis.responses import KinesisResponse

    service = get_service_model("kinesis")
    picker = XFormedAttributePicker(response_transformers=getattr(KinesisResponse, "RESPONSE_KEY_PATH_TO_TRANSFORMER",
                                                                  None))
    serializer = get_serializer_class("kinesis", "json")(operation_model=service.operation_model("GetRecords"),
                                                         value_picker=picker)
    result = {"NextShardIterator": next_iterator, "Records": [r.to_json() for r in records],
              "MillisBehindLatest": millis_behind}
    body = serializer.serialize(result)["body"]
    ours = msgspec.json.encode(get_records_document(records, next_iterator, millis_behind))
    return bool(msgspec.json.decode(body) == msgspec.json.decode(ours))
