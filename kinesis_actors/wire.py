"""``GetRecords`` without botocore's response parser: :class:`WireGetRecords`.

botocore keeps what it does well: the credential chain and its refresh (the client's
request signer), SigV4 signing, the endpoint (the client's resolved ``endpoint_url``;
``GetRecords`` by ``ShardIterator`` has no operation-specific endpoint), the error
classes (``client.exceptions``) and, for any error this module does not know, its own
JSON error parser. The request goes over a kept-alive connection of an
:class:`~kinesis_actors.wire_http.WirePool` (why not urllib3 is said there), or through
urllib3 (botocore's own HTTP library) with :data:`HTTP_ENV` ``=0`` and for a request a
hook moved to another URL. The answer is
parsed with :func:`loads` (msgspec) and turned straight into a
:class:`~kinesis_actors.batch.RecordBatch`: ``Data`` is decoded with pybase64 (SIMD;
``binascii.a2b_base64``, botocore's own decoder, where pybase64 is missing or refuses a
record) and ``ApproximateArrivalTimestamp`` stays float epoch seconds (botocore builds a
``datetime`` per record, a large share of a reader's CPU at full speed).

The parser is msgspec's untyped JSON decoder (``msgspec.json.Decoder()``), chosen by
``python -m bench.read_path parse`` (CPU per MB of payload against ``orjson`` and
botocore's parser, with each base64 decoder; figures in ``bench/DESIGN_FIGURES.md`` and
``bench/read_path.json``). A typed msgspec ``Struct`` would parse a little faster still,
but its schema would have to follow the API's shapes (and the fan-out events') for a
small share of the whole path. The fan-out frames' JSON payloads and the request bodies
go through the same decoder and encoder.

botocore's client event hooks still run around each call (``before-parameter-build``,
``before-send`` (a handler may answer instead of the network, as botocore's stubs and
``kinesis_actors.testing.FaultInjector`` do), ``after-call``, whose ``parsed`` holds
``Data`` still in base64): a user's or a test's hooks see the fast path as they see
botocore's.

Errors are botocore's: a ``ClientError`` of the client's modelled class with
``Error.Code``/``Message`` and ``ResponseMetadata.HTTPStatusCode`` as botocore parses
them, and botocore's connection errors (``EndpointConnectionError``,
``ConnectTimeoutError``, ``ReadTimeoutError``, ``ConnectionClosedError``), so
:func:`~kinesis_actors.errors.is_throttling` and
:func:`~kinesis_actors.errors.translate_aws_error` classify them as before.
"""

from __future__ import annotations

import binascii
import logging
import os
import socket
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from .batch import RecordBatch
from .records import KPL_MAGIC, Record, records_from_response
from .wire_http import WirePool

__all__ = ["loads", "WireGetRecords", "wire_get_records", "batch_from_json_records", "KNOWN_ERROR_CODES",
           "DISABLE_ENV", "HTTP_ENV"]

log = logging.getLogger(__name__)

DISABLE_ENV = "KINESIS_ACTORS_BOTOCORE_GET_RECORDS"
"""Set to ``1`` to read ``GetRecords`` through botocore's own parser (no fast path)."""

HTTP_ENV = "KINESIS_ACTORS_WIRE_HTTP"
"""The HTTP client of the fast path, read when a client's :class:`WireGetRecords` is built:
``1`` (the default) sends over :class:`~kinesis_actors.wire_http.WirePool`, ``0`` over
urllib3 (botocore's own HTTP library, as the fan-out path does). The parser is the same
either way; :data:`DISABLE_ENV` is its own switch."""

KNOWN_ERROR_CODES = frozenset({
    "ExpiredIteratorException", "ProvisionedThroughputExceededException", "ResourceNotFoundException",
    "InvalidArgumentException", "AccessDeniedException", "KMSAccessDeniedException", "KMSDisabledException",
    "KMSInvalidStateException", "KMSNotFoundException", "KMSOptInRequired", "KMSThrottlingException",
    "InternalFailure", "ServiceUnavailable", "LimitExceededException",
})
"""``GetRecords`` error codes built here; any other code goes through botocore's error parser."""

_TARGET = "Kinesis_20131202.GetRecords"
_CONTENT_TYPE = "application/x-amz-json-1.1"

try:
    import msgspec as _msgspec
except ImportError:  # pragma: no cover - a declared dependency
    _decode: Any = None
    _encode: Any = None
else:
    _decode = _msgspec.json.Decoder().decode
    _encode = _msgspec.json.Encoder().encode

try:
    from pybase64 import b64decode as _pyb64
except ImportError:  # pragma: no cover - optional
    _pyb64 = None  # type: ignore[assignment]


def loads(body: bytes | str) -> Any:
    """Parse a JSON document (msgspec; the stdlib's ``json`` where msgspec is missing).

    Raises:
        ValueError: not JSON (``msgspec.DecodeError`` is a ``ValueError``).
    """
    if _decode is not None:
        return _decode(body)
    import json

    return json.loads(body)


def _b64decode_all(texts: list[str]) -> list[bytes]:
    """Base64 ``Data`` of each record: pybase64 (SIMD, strict) where installed, and
    ``binascii.a2b_base64`` (what botocore's ``base64.b64decode`` calls) for a batch it
    refuses, so the bytes are the same."""
    if _pyb64 is not None:
        try:
            return [_pyb64(t, validate=True) for t in texts]
        except ValueError:  # binascii.Error: characters outside the alphabet; botocore skips them
            pass
    a2b = binascii.a2b_base64
    return [a2b(t) for t in texts]


def batch_from_json_records(raw: list[dict[str, Any]], *, shard_id: str, stream: str) -> RecordBatch:
    """The records of a JSON answer (``Data`` base64, ``ApproximateArrivalTimestamp`` epoch
    seconds) as one batch; KPL aggregates are de-aggregated into their user records.

    Raises:
        KeyError, TypeError, binascii.Error: a record without its fields or with bad base64.
    """
    if not raw:  # an idle shard's answer, most of the answers at the tip
        return RecordBatch.empty(shard_id, stream)
    data = _b64decode_all([r["Data"] for r in raw])
    arrivals = [r.get("ApproximateArrivalTimestamp") for r in raw]
    if any(d[:4] == KPL_MAGIC for d in data):
        decoded = [{**r, "Data": d, "ApproximateArrivalTimestamp": a} for r, d, a in zip(raw, data, arrivals)]
        records: list[Record] = records_from_response(decoded, shard_id=shard_id, stream=stream)
        return RecordBatch.from_records(records, shard_id=shard_id, stream=stream)
    return RecordBatch.from_columns(shard_id, stream, data, [r["PartitionKey"] for r in raw],
                                    [r["SequenceNumber"] for r in raw],
                                    [None if a is None else float(a) for a in arrivals])


class WireGetRecords:
    """``GetRecords`` over urllib3 for one boto3 Kinesis client (thread-safe; see the module docstring).

    Args:
        client: a boto3 Kinesis client: its endpoint, request signer (credentials, region),
            connect and read timeouts, ``max_pool_connections`` and event hooks are used.

    Raises (from :meth:`call`):
        botocore.exceptions.ClientError: the service answered with an error (modelled class).
        botocore.exceptions.NoCredentialsError: no credentials (from the signer).
        botocore.exceptions.EndpointConnectionError / ConnectTimeoutError /
            ReadTimeoutError / ConnectionClosedError: the connection failed.
    """

    def __init__(self, client: Any) -> None:
        import urllib3
        from botocore.auth import _host_from_url
        from botocore.httpsession import get_cert_path

        self._client = client
        meta = client.meta
        config = meta.config
        self._url = meta.endpoint_url.rstrip("/") + "/"
        self._events = meta.events
        self._model = meta.service_model.operation_model("GetRecords")
        self._urllib3 = urllib3
        retries = config.retries or {}
        total = retries.get("total_max_attempts") or (retries["max_attempts"] + 1 if "max_attempts" in retries else 2)
        # botocore marks an error of a client allowed one attempt as "MaxAttemptsReached" (it
        # shows in the message); this path makes one attempt and never retries (callers do).
        self._one_attempt = total <= 1
        timeout = urllib3.Timeout(connect=config.connect_timeout, read=config.read_timeout)
        self._pool = urllib3.PoolManager(num_pools=4, maxsize=max(1, config.max_pool_connections), block=False,
                                         timeout=timeout, retries=False, ca_certs=get_cert_path(True))
        # Computed once: botocore's signer otherwise parses the URL for the Host header at
        # every call (its _host_from_url, twice per signature). _host_from_url is private to
        # botocore: if it goes, this __init__ raises and wire_get_records falls back to
        # client.get_records.
        self._host = _host_from_url(self._url)
        # The endpoint's connections (see wire_http); other URLs (a hook that rewrote it) go
        # through urllib3's manager.
        self._http: WirePool | None = None
        if os.environ.get(HTTP_ENV, "1") not in ("", "0"):
            self._http = WirePool(self._url, connect_timeout_s=config.connect_timeout,
                                  read_timeout_s=config.read_timeout, maxsize=config.max_pool_connections,
                                  ca_certs=get_cert_path(True))
        self._path = urllib3.util.parse_url(self._url).request_uri

    def call(self, iterator: str, limit: int, *, shard_id: str, stream: str) -> dict[str, Any]:
        """One ``GetRecords``: the answer with ``Records`` as a :class:`~kinesis_actors.batch.RecordBatch`
        (``NextShardIterator``, ``MillisBehindLatest``, ``ChildShards`` as in the JSON).

        Raises: see the class docstring.
        """
        from botocore.awsrequest import AWSRequest

        params: dict[str, Any] = {"ShardIterator": iterator, "Limit": limit}
        context: dict[str, Any] = {}
        self._events.emit("before-parameter-build.kinesis.GetRecords", params=params, model=self._model,
                          context=context)
        body = _dumps(params)
        request = AWSRequest(method="POST", url=self._url, data=body,
                             headers={"Content-Type": _CONTENT_TYPE, "X-Amz-Target": _TARGET, "Host": self._host})
        self._client._request_signer.sign("GetRecords", request)  # credentials (refreshed), SigV4
        if request.url != self._url:  # a before-sign hook moved the request: sign its own Host
            del request.headers["Host"]
            self._client._request_signer.sign("GetRecords", request)
        prepared = request.prepare()
        hooked = self._events.emit_until_response("before-send.kinesis.GetRecords", request=prepared)[1]
        headers: Mapping[str, str]
        if hooked is not None:
            status, headers, content = hooked.status_code, dict(hooked.headers), hooked.content
        else:
            status, headers, content = self._send(prepared)
        if status != 200:
            raise self._error(status, headers, content)
        parsed: dict[str, Any] = loads(content)
        self._events.emit("after-call.kinesis.GetRecords", http_response=hooked, parsed=parsed, model=self._model,
                          context=context)
        parsed["Records"] = batch_from_json_records(parsed.get("Records") or [], shard_id=shard_id, stream=stream)
        return parsed

    def _send(self, prepared: Any) -> tuple[int, Mapping[str, str], bytes]:
        from botocore import exceptions as bx

        u3 = self._urllib3.exceptions
        url = prepared.url
        if url == self._url and self._http is not None:
            return self._http.post(self._path, list(prepared.headers.items()), prepared.body)
        headers = {k: v for k, v in prepared.headers.items() if k.lower() != "host"}
        try:  # urllib3 (HTTP_ENV=0, or a before-send hook moved it) sets the URL's Host, as botocore does
            response = self._pool.urlopen("POST", url, body=prepared.body, headers=headers, retries=False,
                                          preload_content=True)
        except (u3.NewConnectionError, socket.gaierror) as e:  # botocore's order (httpsession.py)
            raise bx.EndpointConnectionError(endpoint_url=url, error=e) from e
        except u3.SSLError as e:
            raise bx.SSLError(endpoint_url=url, error=e) from e
        except u3.ConnectTimeoutError as e:
            raise bx.ConnectTimeoutError(endpoint_url=url, error=e) from e
        except u3.ReadTimeoutError as e:
            raise bx.ReadTimeoutError(endpoint_url=url, error=e) from e
        except u3.ProtocolError as e:
            raise bx.ConnectionClosedError(error=e, endpoint_url=url) from e
        except Exception as e:
            raise bx.HTTPClientError(error=e) from e
        return response.status, response.headers, response.data  # headers: read on errors only

    def _error(self, status: int, headers: Mapping[str, str], content: bytes) -> Exception:
        """The ``ClientError`` botocore would raise for this error answer."""
        lower = {k.lower(): v for k, v in headers.items()}
        try:
            doc = loads(content) if content else {}
        except ValueError:
            doc = None
        code = str(doc.get("__type") or "").rpartition("#")[2] if isinstance(doc, dict) else ""
        if code not in KNOWN_ERROR_CODES or not isinstance(doc, dict) or "x-amzn-query-error" in lower:
            return self._botocore_error(status, lower, content)
        message = doc.get("message", doc.get("Message", ""))
        response: dict[str, Any] = {
            "Error": {"Message": message, "Code": code},
            "ResponseMetadata": {"RequestId": lower.get("x-amzn-requestid", ""), "HTTPStatusCode": status,
                                 "HTTPHeaders": lower, "RetryAttempts": 0}}
        if self._one_attempt:
            response["ResponseMetadata"]["MaxAttemptsReached"] = True
        shape = self._model.service_model.shape_for_error_code(code)
        if shape is not None:  # botocore adds a modelled error's members (``message``) too
            response.update({name: doc[name] for name in shape.members if isinstance(doc.get(name), str)})
        error_class = self._client.exceptions.from_code(code)
        return error_class(response, "GetRecords")  # type: ignore[no-any-return]

    def _botocore_error(self, status: int, lower: dict[str, str], content: bytes) -> Exception:
        from botocore.awsrequest import HeadersDict
        from botocore.parsers import create_parser

        headers = HeadersDict(lower)
        raw = {"status_code": status, "headers": headers, "body": content}
        parser = create_parser("json")
        parsed = parser.parse(raw, self._model.output_shape)
        parsed.setdefault("ResponseMetadata", {})["RetryAttempts"] = 0
        if self._one_attempt:
            parsed["ResponseMetadata"]["MaxAttemptsReached"] = True
        code = parsed.get("Error", {}).get("Code")
        shape = self._model.service_model.shape_for_error_code(code) if code else None
        if shape is not None:
            parsed.update(parser.parse(raw, shape))
        error_class = self._client.exceptions.from_code(code)
        return error_class(parsed, "GetRecords")  # type: ignore[no-any-return]

    def close(self) -> None:
        """Close the idle pooled connections (later calls open new ones)."""
        if self._http is not None:
            self._http.close()
        self._pool.clear()


def _dumps(params: dict[str, Any]) -> bytes:
    if _encode is not None:
        return _encode(params)  # type: ignore[no-any-return]
    import json

    return json.dumps(params).encode()


_LOCK = threading.Lock()
_BY_CLIENT: weakref.WeakKeyDictionary[Any, WireGetRecords | None] = weakref.WeakKeyDictionary()


def wire_get_records(client: Any) -> WireGetRecords | None:
    """The fast ``GetRecords`` of a boto3 Kinesis client (one per client, kept while the
    client lives), or None where it does not apply: not a botocore client, a proxy
    configured (``Config(proxies=...)``, ``HTTPS_PROXY``/``HTTP_PROXY``), msgspec missing, or
    :data:`DISABLE_ENV` set. Callers then use ``client.get_records``."""
    if os.environ.get(DISABLE_ENV, "") not in ("", "0") or _decode is None:
        return None
    meta = getattr(client, "meta", None)
    if meta is None or getattr(client, "_request_signer", None) is None \
            or getattr(getattr(meta, "service_model", None), "service_name", None) != "kinesis":
        return None
    if getattr(meta.config, "proxies", None) or any(os.environ.get(v) for v in
                                                      ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")):
        return None
    with _LOCK:
        try:
            return _BY_CLIENT[client]
        except KeyError:
            pass
        try:
            wire: WireGetRecords | None = WireGetRecords(client)
        except Exception as e:  # an unusual client: botocore's own path still works
            log.info("fast GetRecords unavailable for this client (%r); using botocore's", e)
            wire = None
        _BY_CLIENT[client] = wire
        return wire
