"""Shared fixtures: hermetic AWS environment, one embedded emulator and one Ray runtime per session."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# Ray 2.60 trip-wires (ENVIRONMENT.md): no token auth, no usage stats, loopback only.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


_CHAOS = Path(__file__).resolve().parent / "chaos"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """tests/chaos runs only when named (``make test-chaos``): its multi-node Ray cluster
    cannot share a driver with the Ray session the other tests use."""
    path = Path(collection_path).resolve()
    if path != _CHAOS and _CHAOS not in path.parents:
        return None
    named = [Path(str(a).split("::")[0]).resolve() for a in config.args]
    return None if any(a == _CHAOS or _CHAOS in a.parents for a in named) else True


@pytest.fixture(autouse=True)
def _hermetic_aws(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """No test can reach a real AWS account or the instance-metadata address."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name, raising=False)
    empty = tmp_path_factory.getbasetemp() / "empty-aws-config"
    empty.touch()
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))


@pytest.fixture(scope="session")
def emulator() -> Iterator[object]:
    """The embedded emulator (moto server, Kinesis + DynamoDB) on 127.0.0.1, one per session."""
    from kinesis_actors.emulator import Emulator

    with Emulator() as emu:
        yield emu


@pytest.fixture(scope="session")
def endpoint(emulator: object) -> str:
    """HTTP endpoint URL of the session's emulator."""
    return emulator.endpoint  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def kinesalite() -> Iterator[str]:
    """Endpoint URL of kinesalite (npm; tests/kinesalite) on 127.0.0.1, one per session.

    Kinesis only: lease tables stay on the ``endpoint`` fixture's DynamoDB (moto).
    Skipped when node or the package is missing, except under ``CI`` or
    ``KINESALITE_REQUIRED=1`` (``make test-kinesalite``), where that fails the test.
    """
    from tests.kinesalite.launcher import Kinesalite, KinesaliteUnavailable

    try:
        server = Kinesalite.start()
    except KinesaliteUnavailable as e:
        if os.environ.get("CI") or os.environ.get("KINESALITE_REQUIRED") == "1":
            pytest.fail(f"kinesalite is required here: {e}")
        pytest.skip(f"kinesalite unavailable ({e}); `make test-kinesalite` installs it")
    yield server.endpoint
    report = server.exit_report()  # a server that died mid-session says why
    server.stop()
    if report:
        pytest.fail(report)


@pytest.fixture(scope="session")
def kinesis_mock() -> Iterator[str]:
    """Endpoint URL of kinesis-mock (npm kinesis-local, enhanced fan-out) on 127.0.0.1, one per session.

    Kinesis only: lease tables stay on the ``endpoint`` fixture's DynamoDB (moto). It is
    installed into the kinesis-actors cache folder on first use (``npm ci``). Skipped when
    node is missing or it does not start, except under ``CI`` or ``KINESIS_MOCK_REQUIRED=1``
    (``make test-kinesis-mock``), where that fails the test.
    """
    from kinesis_actors.emulator import EmulatorError, KinesisMock

    server = KinesisMock()
    try:
        server.start()
    except EmulatorError as e:
        if os.environ.get("CI") or os.environ.get("KINESIS_MOCK_REQUIRED") == "1":
            pytest.fail(f"kinesis-mock is required here: {e}")
        pytest.skip(f"kinesis-mock unavailable ({e}); `make test-kinesis-mock` installs it")
    yield server.endpoint
    alive = server.pid is not None
    server.stop()
    if not alive:
        pytest.fail("kinesis-mock died during the session")


@pytest.fixture
def unique() -> str:
    """A unique lower-case suffix for stream and table names."""
    return uuid.uuid4().hex[:10]


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """One local Ray runtime per session (2 CPUs, no dashboard, loopback), shut down at the end.

    Reuses a runtime that is already running (and then leaves it running).
    """
    import ray

    started = False
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, _node_ip_address="127.0.0.1")
        started = True
    yield
    if started:
        ray.shutdown()
