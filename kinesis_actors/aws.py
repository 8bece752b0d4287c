"""AWS settings shared by the broker, its actors and the DynamoDB lease store.

An :class:`AwsSettings` is a small picklable value: it crosses into Ray actors, where
each process builds its own boto3 clients from it (boto3 clients cannot be pickled).
Credentials follow boto3's default chain unless ``test_credentials`` (fixed dummy keys
for emulators) or explicit frozen credentials from a ``boto3.Session`` are given.
``repr()`` never shows a secret.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

__all__ = ["AwsSettings", "LazyClient", "TEST_ACCESS_KEY", "TEST_SECRET_KEY", "DEFAULT_REGION"]

TEST_ACCESS_KEY = "testing"
TEST_SECRET_KEY = "testing"
DEFAULT_REGION = "us-east-1"


@dataclasses.dataclass(frozen=True)
class AwsSettings:
    """Where and as whom to call AWS.

    Attributes:
        endpoint: endpoint URL for every service (an emulator such as
            ``http://127.0.0.1:5000``), or None for AWS itself.
        region: AWS region name, or None for boto3's default chain.
        test_credentials: use fixed dummy keys (``testing``/``testing``), for emulators.
        credentials: ``(access_key, secret_key, token)`` frozen from a ``boto3.Session``,
            or None for the default credential chain (resolved lazily on the first call).
        profile: a named profile of the AWS config files, or None.
        connect_timeout_s / read_timeout_s: botocore socket timeouts, seconds.
        max_attempts: botocore ``standard`` retry mode retries after the first attempt
            (throttling, 5xx, network); 0 disables botocore's retries.
        faults: a fault injector installed on every client built from these settings
            (``kinesis_actors.testing.FaultInjector``), or None (the default: no hook, no
            cost). Not part of equality or the session cache key.
    """

    endpoint: str | None = None
    region: str | None = None
    test_credentials: bool = False
    credentials: tuple[str, str, str | None] | None = dataclasses.field(default=None, repr=False)
    profile: str | None = None
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 10.0
    max_attempts: int = 3
    faults: Any = dataclasses.field(default=None, compare=False, repr=False)

    def merged_over(self, base: AwsSettings) -> AwsSettings:
        """Return these settings with every unset field (None/False) taken from ``base``."""
        changes: dict[str, Any] = {}
        for name in ("endpoint", "region", "credentials", "profile"):
            if getattr(self, name) is None and getattr(base, name) is not None:
                changes[name] = getattr(base, name)
        if not self.test_credentials and base.test_credentials and self.credentials is None:
            changes["test_credentials"] = True
        return dataclasses.replace(self, **changes) if changes else self

    def _session_key(self) -> tuple[Any, ...]:
        """What a session depends on: who calls and where (not timeouts, retries or faults)."""
        return (self.test_credentials, self.credentials, self.profile, self.region)

    def session(self) -> Any:
        """The ``boto3.Session`` for these settings: one per process and identity (credentials,
        profile, region), so settings that differ only in timeouts or retries share it.

        Every session of the process shares one botocore loader: the service models and
        endpoint rules (JSON files) are read and parsed once per process, not once per session.
        """
        import boto3

        with _LOCK:
            key = self._session_key()
            cached = _SESSIONS.get(key)
            if cached is None:
                kwargs: dict[str, Any] = {}
                if self.test_credentials:
                    kwargs.update(aws_access_key_id=TEST_ACCESS_KEY, aws_secret_access_key=TEST_SECRET_KEY)
                elif self.credentials is not None:
                    access_key, secret, token = self.credentials
                    kwargs.update(aws_access_key_id=access_key, aws_secret_access_key=secret, aws_session_token=token)
                if self.profile:
                    kwargs["profile_name"] = self.profile
                region = self.region or (DEFAULT_REGION if self.test_credentials else None)
                if region:
                    kwargs["region_name"] = region
                cached = _SESSIONS[key] = boto3.Session(botocore_session=_botocore_session(), **kwargs)
            return cached

    def client(self, service: str, *, read_timeout_s: float | None = None, max_attempts: int | None = None,
               max_pool_connections: int = 32) -> Any:
        """A boto3 client for ``service`` (``"kinesis"`` or ``"dynamodb"``).

        Uses botocore's ``standard`` retry mode (exponential backoff with jitter on
        throttling, 5xx and network errors) and the socket timeouts above. Building a
        client does no network I/O; credentials are fetched on the first request.
        ``max_pool_connections``: HTTP connections kept (botocore opens and discards
        extra ones when more threads call at once: size it like the calling threads).
        """
        from botocore.config import Config

        config = Config(
            connect_timeout=self.connect_timeout_s,
            read_timeout=read_timeout_s if read_timeout_s is not None else self.read_timeout_s,
            retries={"mode": "standard", "max_attempts": self.max_attempts if max_attempts is None else max_attempts},
            max_pool_connections=max_pool_connections,
        )
        session = self.session()
        with _LOCK:  # building clients from one session is not thread-safe
            client = session.client(service, endpoint_url=self.endpoint, config=config)
        if self.faults is not None:  # tests only: kinesis_actors.testing.FaultInjector
            self.faults.install(client, read_timeout_s=config.read_timeout)
        return client


class LazyClient:
    """A boto3 client built on first use (the first attribute read), once, thread-safely.

    For a process whose first AWS call comes later than its construction: building a client
    costs a few tenths of a CPU second (boto3's import, the service model and endpoint JSON),
    which a Coordinator spends better after it launched its readers. Attribute reads are
    forwarded to the real client (``lazy.list_shards(...)``, ``lazy.meta``).

    Args:
        build: makes the client (e.g. ``lambda: settings.client("kinesis")``); its errors
            surface at the first use.
    """

    def __init__(self, build: Any) -> None:
        self._build = build
        self._client: Any = None
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        client = self._client
        if client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._build()
                client = self._client
        return getattr(client, name)


def _botocore_session() -> Any:
    """A new botocore session using the process's shared loader (created on first use)."""
    global _LOADER
    import botocore.loaders
    import botocore.session

    session = botocore.session.get_session()
    if _LOADER is None:
        _LOADER = botocore.loaders.create_loader(session.get_config_variable("data_path"))
    session.register_component("data_loader", _LOADER)
    return session


_LOCK = threading.RLock()
_SESSIONS: dict[tuple[Any, ...], Any] = {}
_LOADER: Any = None
