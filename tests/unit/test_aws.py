"""AwsSettings sessions and LazyClient (no AWS calls: building a client does no I/O)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from kinesis_actors.aws import AwsSettings, LazyClient


def test_settings_that_differ_only_in_timeouts_share_one_session() -> None:
    a = AwsSettings(endpoint="http://127.0.0.1:1", region="us-east-1", test_credentials=True)
    b = AwsSettings(endpoint="http://127.0.0.1:1", region="us-east-1", test_credentials=True, connect_timeout_s=1.0,
                    read_timeout_s=2.0, max_attempts=0)
    other = AwsSettings(endpoint="http://127.0.0.1:1", region="eu-west-1", test_credentials=True)
    assert a.session() is b.session()
    assert other.session() is not a.session()
    assert a.session()._session.get_component("data_loader") is other.session()._session.get_component("data_loader")
    client = b.client("kinesis", read_timeout_s=3.0)
    assert client.meta.config.read_timeout == 3.0 and client.meta.config.connect_timeout == 1.0


def test_a_lazy_client_is_built_once_on_first_use_even_from_many_threads() -> None:
    built: list[int] = []
    ready = threading.Barrier(8)

    class Client:
        def describe(self) -> str:
            return "ok"

    def build() -> Any:
        built.append(1)
        return Client()

    lazy = LazyClient(build)
    assert built == []
    out: list[str] = []

    def use() -> None:
        ready.wait()
        out.append(lazy.describe())

    threads = [threading.Thread(target=use) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert out == ["ok"] * 8 and built == [1]


def test_a_lazy_client_raises_what_building_raised_at_first_use() -> None:
    def build() -> Any:
        raise RuntimeError("no region")

    lazy = LazyClient(build)
    with pytest.raises(RuntimeError, match="no region"):
        lazy.list_shards()
