""":class:`DynamoLeaseStore`: the lease table in Amazon DynamoDB (KCL style), shared by instances.

The lease logic is in :class:`~kinesis_actors.leases.base.BaseLeaseStore`; this module
maps its four primitives onto DynamoDB:

- read: ``GetItem`` with ``ConsistentRead=True``;
- scan: ``Scan`` with ``ConsistentRead=True``, a ``FilterExpression`` on the ``stream``
  attribute and the ``"<stream>:"`` (shard rows) or ``"<stream>#instance#"`` (presence
  rows) key prefix, paged through ``LastEvaluatedKey``;
- create: ``PutItem`` with ``ConditionExpression=attribute_not_exists(lease_key)``;
- update: ``UpdateItem`` with a ``ConditionExpression`` on ``lease_counter`` and
  ``lease_owner`` (``attribute_not_exists(lease_owner)`` for a free row) and
  ``ReturnValues=ALL_NEW``; ``ConditionalCheckFailedException`` is the failed condition;
- delete (presence rows only): ``DeleteItem``.

On first use the table is checked (``DescribeTable``) and, with ``create_if_missing``,
created (``CreateTable``, ``PAY_PER_REQUEST``, hash key ``lease_key`` S; a concurrent
creator's ``ResourceInUseException`` is fine), then the ``table_exists`` waiter waits
until it is ACTIVE. ``checkpoint`` is stored as S: Kinesis sequence numbers have 56
digits, more than a DynamoDB number holds.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..aws import AwsSettings
from ..errors import InvalidError, KinesisError, LeaseStoreError, aws_error_code, translate_aws_error
from .base import BaseLeaseStore
from .rows import COUNTER, KEY, OWNER, STREAM, Row

__all__ = ["DynamoLeaseStore"]

logger = logging.getLogger(__name__)

_TABLE_RE = re.compile(r"^[A-Za-z0-9_.\-]{3,255}$")
_CLIENT_LOCK = threading.Lock()  # boto3 sessions are not thread-safe when building clients

_WAITER_DELAY_S = 1
_WAITER_MAX_ATTEMPTS = 120


@functools.cache
def _method_name(operation: str) -> str:
    """``"UpdateItem"`` -> ``"update_item"`` (the boto3 client method), computed once per operation."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", operation).lower()


def _to_attr(value: Any) -> dict[str, Any]:
    """Python value -> DynamoDB AttributeValue (str: S, int and finite float: N, tuple/list/set of str: SS)."""
    if isinstance(value, bool):
        return {"BOOL": value}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, int):
        return {"N": str(value)}
    if isinstance(value, float) and math.isfinite(value):
        return {"N": repr(value)}
    if isinstance(value, (tuple, list, set, frozenset)):
        return {"SS": sorted(str(v) for v in value)}
    raise TypeError(f"cannot store {type(value).__name__} in the lease table")


def _from_attr(attr: Mapping[str, Any]) -> Any:
    """DynamoDB AttributeValue -> Python value (N: int when integral)."""
    (kind, value), = attr.items()
    if kind == "S":
        return value
    if kind == "N":
        try:
            return int(value)
        except ValueError:
            return float(value)
    if kind == "SS":
        return tuple(sorted(value))
    if kind == "L":
        return tuple(_from_attr(v) for v in value)
    if kind == "BOOL":
        return bool(value)
    if kind == "NULL":
        return None
    return value


def _to_item(row: Mapping[str, Any]) -> dict[str, Any]:
    return {name: _to_attr(value) for name, value in row.items() if value is not None and value != ()}


def _from_item(item: Mapping[str, Any]) -> Row:
    return {name: _from_attr(attr) for name, attr in item.items()}


def _frozen_session_settings(session: Any) -> tuple[tuple[str, str, str | None] | None, str | None]:
    """Credentials frozen from a ``boto3.Session`` (may resolve its chain) and its region."""
    creds = session.get_credentials()
    frozen = None
    if creds is not None:
        f = creds.get_frozen_credentials()
        frozen = (f.access_key, f.secret_key, f.token)
    return frozen, session.region_name


class DynamoLeaseStore(BaseLeaseStore):
    """The lease table in DynamoDB: strongly consistent reads, conditional writes.

    The constructor does no I/O. On first use the table is described and, with
    ``create_if_missing``, created (``PAY_PER_REQUEST``; several instances creating it at
    once all succeed) and waited for until ACTIVE. Settings left as None are inherited
    from the broker the store is given to (:meth:`bind`); explicit values are never
    overwritten. The store is picklable: the boto3 client is rebuilt lazily in each
    process, and the observation table starts empty there.

    Args:
        table: table name (3-255 characters of ``[a-zA-Z0-9_.-]``).
        create_if_missing: create the table on first use if it does not exist.
        endpoint: DynamoDB endpoint URL (an emulator), or None (inherit, else AWS).
        region: AWS region, or None (inherit, else boto3's default chain).
        test_credentials: True for fixed dummy keys (emulators); None inherits; False
            forces boto3's default credential chain.
        session: a ``boto3.Session`` whose credentials and region to use (frozen when the
            store is pickled or first used), or None.
        clock: monotonic clock, seconds (judges expiry).
        wall_clock: epoch clock, seconds (informational ``lease_expiry`` only).
        scan_page_size: ``Limit`` of each ``Scan`` page, or None for DynamoDB's 1 MB pages.

    Raises:
        InvalidError: a bad table name or ``scan_page_size``.

    Errors of the methods: a missing table without ``create_if_missing`` ->
    ``LeaseStoreError`` naming it; throttling or network errors after botocore's own
    retries -> ``LeaseStoreError(retriable=True)``; any other botocore error is
    translated by :func:`kinesis_actors.errors.translate_aws_error` and raised as
    ``LeaseStoreError`` (``InvalidError`` for a validation error), the cause chained.

    Example:
        >>> store = DynamoLeaseStore("app-leases", create_if_missing=True,
        ...                          endpoint="http://127.0.0.1:5000", region="us-east-1",
        ...                          test_credentials=True)
        >>> lease = store.take("orders", "shardId-000000000000", owner="a", duration_s=10.0)
        >>> lease = store.checkpoint(lease, "49590338271490256608559692538361571095921575989136588898")
        >>> store.release(lease).owner is None
        True
    """

    _TRANSIENT = ("_client", "_client_lock", "_ready")

    def __init__(
        self,
        table: str,
        *,
        create_if_missing: bool = False,
        endpoint: str | None = None,
        region: str | None = None,
        test_credentials: bool | None = None,
        session: Any = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        scan_page_size: int | None = None,
    ) -> None:
        if not isinstance(table, str) or not _TABLE_RE.match(table):
            raise InvalidError(
                f"lease table name must be 3-255 characters of letters, digits, '_', '.', '-'; got {table!r}"
            )
        if scan_page_size is not None and (
            isinstance(scan_page_size, bool) or not isinstance(scan_page_size, int) or scan_page_size < 1
        ):
            raise InvalidError(f"scan_page_size must be a positive int or None, got {scan_page_size!r}")
        if endpoint is not None and (not isinstance(endpoint, str) or not endpoint):
            raise InvalidError(f"endpoint must be a URL string or None, got {endpoint!r}")
        self._table = table
        self._create_if_missing = bool(create_if_missing)
        self._endpoint = endpoint
        self._region = region
        self._test_credentials = test_credentials
        self._session = session
        self._inherited: AwsSettings | None = None
        self._faults: Any = None  # set by inject_faults() (tests)
        self._scan_page_size = scan_page_size
        super().__init__(clock=clock, wall_clock=wall_clock)

    def _init_transient(self) -> None:
        super()._init_transient()
        self._client: Any = None
        self._client_lock = threading.Lock()
        self._ready = False

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        session = state.pop("_session", None)
        if session is not None:  # a boto3 Session cannot be pickled: freeze what it holds
            credentials, region = _frozen_session_settings(session)
            state["_frozen_session"] = (credentials, region)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("_session", None)
        super().__setstate__(state)

    # ------------------------------------------------------------------ settings
    @property
    def table(self) -> str:
        """The lease table name."""
        return self._table

    @property
    def endpoint(self) -> str | None:
        """The endpoint URL in effect (explicit, else inherited from the broker), or None."""
        return self._endpoint if self._endpoint is not None else (self._inherited.endpoint if self._inherited else None)

    def __repr__(self) -> str:
        return f"DynamoLeaseStore(table={self._table!r}, endpoint={self.endpoint!r})"

    def bind(self, aws: AwsSettings) -> DynamoLeaseStore:
        """A copy whose settings left as None are taken from the broker's ``aws``.

        Explicit endpoint, region, credentials (``test_credentials``, ``session``) are
        never overwritten. No I/O.

        Args:
            aws: the broker's AWS settings.

        Returns:
            A new store (same table and clocks, empty observation table).

        Raises:
            InvalidError: ``aws`` is not an ``AwsSettings``.
        """
        if not isinstance(aws, AwsSettings):
            raise InvalidError(f"bind needs an AwsSettings, got {type(aws).__name__}")
        other = self.peer()
        assert isinstance(other, DynamoLeaseStore)
        other._session = self._session
        other._inherited = aws
        return other

    def inject_faults(self, injector: Any) -> DynamoLeaseStore:
        """Route every DynamoDB call of this store's clients, in every process, through a test fault injector.

        For tests: ``kinesis_actors.testing.with_faults(..., lease_store=True)`` is the
        entry point. The injector travels with the store when it is pickled into
        Coordinators and ShardReaders; rules with ``service="dynamodb"`` then reach the
        lease table. Changes this store in place.

        Args:
            injector: a ``kinesis_actors.testing.FaultInjector``, or None to remove one.

        Returns:
            self.
        """
        self._faults = injector
        return self

    def settings(self) -> AwsSettings:
        """The AWS settings in effect: explicit values, then the inherited ones.

        May resolve the credentials of an explicit ``boto3.Session`` (no network I/O for
        static keys).
        """
        own = AwsSettings(endpoint=self._endpoint, region=self._region, test_credentials=bool(self._test_credentials))
        frozen = getattr(self, "_frozen_session", None)
        if self._session is not None:
            frozen = _frozen_session_settings(self._session)
        if frozen is not None:
            credentials, session_region = frozen
            own = dataclasses.replace(
                own, test_credentials=False, credentials=credentials, region=own.region or session_region
            )
        merged = own if self._inherited is None else own.merged_over(self._inherited)
        if self._inherited is not None and (self._test_credentials is False or frozen is not None):
            merged = dataclasses.replace(merged, test_credentials=False)
        if self._faults is not None:
            merged = dataclasses.replace(merged, faults=self._faults)
        return merged

    # ------------------------------------------------------------------ client and table
    def _client_now(self) -> Any:
        if self._client is None:
            settings = self.settings()
            with _CLIENT_LOCK:
                if self._client is None:
                    self._client = settings.client("dynamodb")
        return self._client

    def _translate(self, exc: BaseException, operation: str) -> KinesisError:
        """Every botocore error of this store goes through here (then ``raise ... from exc``)."""
        translated = translate_aws_error(exc, operation=operation, resource=self._table)
        code = translated.aws_code or aws_error_code(exc)
        if code == "ResourceNotFoundException":
            self._ready = False
            return LeaseStoreError(f"lease table {self._table!r} does not exist ({operation})", aws_code=code)
        if isinstance(translated, (InvalidError, LeaseStoreError)):
            return translated
        return LeaseStoreError(
            f"lease table {self._table!r}: {translated}", aws_code=code, retriable=translated.retriable
        )

    def _api(self, operation: str, *, conditional: bool = False, **kwargs: Any) -> Any:
        """Call one DynamoDB API; None when ``conditional`` and the condition failed."""
        from botocore.exceptions import BotoCoreError, ClientError

        client = self._client_now()
        method = getattr(client, _method_name(operation))
        try:
            return method(**kwargs)
        except (ClientError, BotoCoreError) as e:
            if conditional and aws_error_code(e) == "ConditionalCheckFailedException":
                return None
            raise self._translate(e, operation) from e

    def _ensure_table(self) -> None:
        if self._ready:
            return
        with self._client_lock:
            if self._ready:
                return
            from botocore.exceptions import BotoCoreError, ClientError, WaiterError

            client = self._client_now()
            status = None
            try:
                status = client.describe_table(TableName=self._table)["Table"].get("TableStatus")
            except (ClientError, BotoCoreError) as e:
                if aws_error_code(e) != "ResourceNotFoundException":
                    raise self._translate(e, "DescribeTable") from e
                if not self._create_if_missing:
                    raise LeaseStoreError(
                        f"lease table {self._table!r} does not exist "
                        "(create it, or pass create_if_missing=True)",
                        aws_code="ResourceNotFoundException",
                    ) from e
                self._create_table(client)
            if status != "ACTIVE":
                try:
                    client.get_waiter("table_exists").wait(
                        TableName=self._table,
                        WaiterConfig={"Delay": _WAITER_DELAY_S, "MaxAttempts": _WAITER_MAX_ATTEMPTS},
                    )
                except WaiterError as e:
                    raise LeaseStoreError(
                        f"lease table {self._table!r} did not become ACTIVE", retriable=True
                    ) from e
                except (ClientError, BotoCoreError) as e:
                    raise self._translate(e, "DescribeTable") from e
            self._ready = True

    def _create_table(self, client: Any) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            client.create_table(
                TableName=self._table,
                AttributeDefinitions=[{"AttributeName": KEY, "AttributeType": "S"}],
                KeySchema=[{"AttributeName": KEY, "KeyType": "HASH"}],
                BillingMode="PAY_PER_REQUEST",
            )
            logger.info("created lease table %s", self._table)
        except (ClientError, BotoCoreError) as e:
            if aws_error_code(e) != "ResourceInUseException":  # another instance created it first
                raise self._translate(e, "CreateTable") from e

    # ------------------------------------------------------------------ primitives
    def _read(self, key: str) -> Row | None:
        self._ensure_table()
        response = self._api("GetItem", TableName=self._table, Key={KEY: {"S": key}}, ConsistentRead=True)
        item = response.get("Item")
        return _from_item(item) if item else None

    def _scan(self, stream: str) -> list[Row]:
        self._ensure_table()
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "ConsistentRead": True,
            "FilterExpression": "#stream = :stream AND (begins_with(#key, :prefix) OR begins_with(#key, :presence))",
            "ExpressionAttributeNames": {"#stream": STREAM, "#key": KEY},
            "ExpressionAttributeValues": {":stream": {"S": stream}, ":prefix": {"S": f"{stream}:"},
                                          ":presence": {"S": f"{stream}#instance#"}},
        }
        if self._scan_page_size is not None:
            kwargs["Limit"] = self._scan_page_size
        rows: list[Row] = []
        while True:
            response = self._api("Scan", **kwargs)
            rows.extend(_from_item(item) for item in response.get("Items", ()))
            last = response.get("LastEvaluatedKey")
            if not last:
                return rows
            kwargs["ExclusiveStartKey"] = last

    def _put_new(self, item: Row) -> bool:
        self._ensure_table()
        response = self._api(
            "PutItem",
            conditional=True,
            TableName=self._table,
            Item=_to_item(item),
            ConditionExpression="attribute_not_exists(#key)",
            ExpressionAttributeNames={"#key": KEY},
        )
        return response is not None

    def _delete(self, key: str) -> None:
        self._ensure_table()
        self._api("DeleteItem", TableName=self._table, Key={KEY: {"S": key}})

    def _update(
        self,
        key: str,
        expect_owner: str | None,
        expect_counter: int,
        set_fields: Mapping[str, Any],
        remove_fields: Iterable[str] = (),
        *,
        check_owner: bool = True,
    ) -> Row | None:
        self._ensure_table()
        names: dict[str, str] = {"#key": KEY, "#counter": COUNTER}
        values: dict[str, Any] = {":expect_counter": {"N": str(int(expect_counter))}}
        condition = "attribute_exists(#key) AND #counter = :expect_counter"
        if check_owner:
            names["#owner"] = OWNER
            if expect_owner is None:
                condition += " AND attribute_not_exists(#owner)"
            else:
                condition += " AND #owner = :expect_owner"
                values[":expect_owner"] = {"S": expect_owner}
        sets = []
        for i, (name, value) in enumerate(set_fields.items()):
            names[f"#s{i}"] = name
            values[f":s{i}"] = _to_attr(value)
            sets.append(f"#s{i} = :s{i}")
        removes = []
        for i, name in enumerate(remove_fields):
            names[f"#r{i}"] = name
            removes.append(f"#r{i}")
        expression = ""
        if sets:
            expression += "SET " + ", ".join(sets)
        if removes:
            expression += (" " if expression else "") + "REMOVE " + ", ".join(removes)
        response = self._api(
            "UpdateItem",
            conditional=True,
            TableName=self._table,
            Key={KEY: {"S": key}},
            UpdateExpression=expression,
            ConditionExpression=condition,
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
            ReturnValues="ALL_NEW",
        )
        if response is None:
            return None
        return _from_item(response["Attributes"])
