"""The state a broker and everything taken from it share: settings, clients, open subscriptions.

``copy.copy(broker)``, publishers and seek handles hold the same :class:`ConnectionState`,
so a publisher taken before ``connect()`` works once connected, and every one of them
raises :class:`~kinesis_actors.errors.NotConnectedError` after ``shutdown()``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from .aws import AwsSettings
from .errors import NotConnectedError

if TYPE_CHECKING:
    from .broker import Subscription

__all__ = ["ConnectionState"]


class ConnectionState:
    """Mutable connection shared by a broker, its copies, publishers and seek handles.

    Attributes:
        aws: settings once connected, else None.
        closed: True after ``shutdown()``.
        subscriptions: open subscriptions by stream name.
    """

    def __init__(self) -> None:
        self.aws: AwsSettings | None = None
        self.closed = False
        self.lock = threading.RLock()
        self.subscriptions: dict[str, Subscription] = {}
        self._clients: dict[str, Any] = {}

    @classmethod
    def detached(cls, aws: AwsSettings) -> ConnectionState:
        """A connected state for another process (a Ray task or actor) built from settings only."""
        state = cls()
        state.aws = aws
        return state

    def require(self) -> AwsSettings:
        """The settings of a live connection.

        Raises:
            NotConnectedError: before ``connect()`` or after ``shutdown()``.
        """
        if self.closed:
            raise NotConnectedError("the broker's connection was shut down")
        if self.aws is None:
            raise NotConnectedError("the broker is not connected yet: call connect() first")
        return self.aws

    def client(self, service: str, *, max_attempts: int | None = None) -> Any:
        """The process's boto3 client for ``service`` on this connection (built once, lazily).

        Args:
            service: ``"kinesis"`` or ``"dynamodb"``.
            max_attempts: botocore's retries (``AwsSettings.max_attempts`` when None); 0 for a
                caller that retries itself (:class:`~kinesis_actors.backoff.Retry`), so retries
                stay in one layer. One client is kept per value.

        Raises:
            NotConnectedError: before ``connect()`` or after ``shutdown()``.
        """
        aws = self.require()
        key = service if max_attempts is None else f"{service}/{max_attempts}"
        with self.lock:
            client = self._clients.get(key)
            if client is None:
                client = self._clients[key] = aws.client(service, max_attempts=max_attempts)
            return client
