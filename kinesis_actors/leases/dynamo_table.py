"""The DynamoDB lease table itself, before any row is read: its name and endpoint checked,
a ``boto3.Session``'s settings frozen, and the table checked or created on first use.

On first use the table is checked (``DescribeTable``) and, with ``create_if_missing``,
created (``CreateTable``, ``PAY_PER_REQUEST``, hash key ``lease_key`` S; a concurrent
creator's ``ResourceInUseException`` is fine), then the ``table_exists`` waiter waits
until it is ACTIVE (a DescribeTable every second, at most 120 times). Used by
:class:`~kinesis_actors.leases.dynamodb.DynamoRows` and ``DynamoLeaseStore`` (and, through
them, the KCL store).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from ..errors import InvalidError, KinesisError, LeaseStoreError, aws_error_code
from .rows import KEY

__all__ = ["check_settings", "frozen_session_settings", "check_or_create_table"]

logger = logging.getLogger("kinesis_actors.leases.dynamodb")

_TABLE_RE = re.compile(r"^[A-Za-z0-9_.\-]{3,255}$")
_WAITER_DELAY_S = 1
_WAITER_MAX_ATTEMPTS = 120


def check_settings(table: object, endpoint: object) -> None:
    """Raise :class:`InvalidError` for a bad table name (DynamoDB's rule: 3-255 characters of
    letters, digits, ``_``, ``.``, ``-``) or endpoint (not a non-empty string nor None); no I/O."""
    if not isinstance(table, str) or not _TABLE_RE.match(table):
        raise InvalidError(f"lease table name must be 3-255 characters of letters, digits, '_', '.', '-'; "
                           f"got {table!r}")
    if endpoint is not None and (not isinstance(endpoint, str) or not endpoint):
        raise InvalidError(f"endpoint must be a URL string or None, got {endpoint!r}")


def frozen_session_settings(session: Any) -> tuple[tuple[str, str, str | None] | None, str | None]:
    """Credentials frozen from a ``boto3.Session`` (may resolve its chain: I/O for an
    assumed role or instance profile) as ``(access_key, secret_key, token)`` or None, and
    its region. A session cannot be pickled; these can."""
    creds = session.get_credentials()
    frozen = None
    if creds is not None:
        f = creds.get_frozen_credentials()
        frozen = (f.access_key, f.secret_key, f.token)
    return frozen, session.region_name


def check_or_create_table(client: Any, table: str, *, create_if_missing: bool,
                          translate: Callable[[BaseException, str], KinesisError]) -> None:
    """Check that ``table`` exists, create it when missing and ``create_if_missing``, and
    wait until it is ACTIVE (see the module docstring).

    Args:
        client: a boto3 DynamoDB client. table: the table name.
        create_if_missing: create a missing table (else a missing one is an error).
        translate: turns a botocore error of the named operation into the store's error.

    Raises:
        LeaseStoreError: missing without ``create_if_missing`` (``aws_code``
            ``ResourceNotFoundException``), or not ACTIVE in time (``retriable``).
        KinesisError: what ``translate`` makes of any other error of ``DescribeTable`` or
            ``CreateTable``.
    """
    from botocore.exceptions import BotoCoreError, ClientError, WaiterError

    status = None
    try:
        status = client.describe_table(TableName=table)["Table"].get("TableStatus")
    except (ClientError, BotoCoreError) as e:
        if aws_error_code(e) != "ResourceNotFoundException":
            raise translate(e, "DescribeTable") from e
        if not create_if_missing:
            raise LeaseStoreError(f"lease table {table!r} does not exist (create it, or pass "
                                  "create_if_missing=True)", aws_code="ResourceNotFoundException") from e
        try:
            client.create_table(TableName=table, BillingMode="PAY_PER_REQUEST",
                                AttributeDefinitions=[{"AttributeName": KEY, "AttributeType": "S"}],
                                KeySchema=[{"AttributeName": KEY, "KeyType": "HASH"}])
            logger.info("created lease table %s", table)
        except (ClientError, BotoCoreError) as e2:
            if aws_error_code(e2) != "ResourceInUseException":  # another instance created it first
                raise translate(e2, "CreateTable") from e2
    if status != "ACTIVE":
        try:
            client.get_waiter("table_exists").wait(
                TableName=table, WaiterConfig={"Delay": _WAITER_DELAY_S, "MaxAttempts": _WAITER_MAX_ATTEMPTS})
        except WaiterError as e:
            raise LeaseStoreError(f"lease table {table!r} did not become ACTIVE", retriable=True) from e
        except (ClientError, BotoCoreError) as e:
            raise translate(e, "DescribeTable") from e
