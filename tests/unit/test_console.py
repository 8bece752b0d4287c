"""What people see: the lease table view and progress on terminals without a width (no Ray, no network)."""

from __future__ import annotations

import io
import signal
import time

import pytest

from kinesis_actors import console
from kinesis_actors.leases.view import print_lease_table


def render(rows: list[dict[str, object]], **kwargs: object) -> str:
    from rich.console import Console

    out = io.StringIO()
    print_lease_table(Console(file=out, width=200), "t", rows, expiry=True, **kwargs)  # type: ignore[arg-type]
    return out.getvalue()


def test_a_free_lease_is_shown_free_and_the_expiry_is_the_holders_clock() -> None:
    now_ms = int(time.time() * 1000)
    text = render([
        {"stream": "s", "shard_id": "shardId-000000000000", "owner": None, "counter": 7, "checkpoint": "99",
         "expiry_ms": now_ms - 60_000},  # released a minute ago: its expiry is in the past
        {"stream": "s", "shard_id": "shardId-000000000001", "owner": "a", "counter": 3, "checkpoint": None,
         "expiry_ms": now_ms + 9_000},
    ], records={"shardId-000000000000": 41})
    assert "expiry (holder's clock, UTC)" in text and "checkpoint (sequence number)" in text
    free = next(line for line in text.splitlines() if "shardId-000000000000" in line)
    held = next(line for line in text.splitlines() if "shardId-000000000001" in line)
    assert "free" in free.split() and "(-" not in free, "a free lease shows no expiry in the past"
    assert "(+9" in held or "(+8" in held
    assert free.split()[3:5] == ["41", "99"] and held.split()[3] == "0", "records read, apart from the checkpoint"


def test_progress_falls_back_to_plain_lines_on_a_terminal_without_width(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(console, "terminal_columns", lambda: 0)
    with console.progress(100, "publish", "ev", enabled=True) as bar:
        for _ in range(10):
            bar.update(10)
        bar.set_postfix_str("1.2 MB/s")
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1] == "publish: 100/100 ev, 1.2 MB/s", lines
    assert all("\r" not in line for line in lines)


def test_progress_is_a_real_bar_on_a_terminal_with_width_and_nothing_when_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tqdm import tqdm

    monkeypatch.setattr(console, "terminal_columns", lambda: 120)
    assert isinstance(console.progress(1, "x", "ev", enabled=True), tqdm)
    off = console.progress(1, "x", "ev", enabled=False)
    assert isinstance(off, tqdm) and off.disable


def test_install_sigint_lets_ctrl_c_through_an_inherited_ignore_and_block_and_its_undo_puts_them_back() -> None:
    handler, mask = signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # what a script's `cmd &` passes on, here with a block too
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        undo = console.install_sigint()
        assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        undo()
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        assert signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, handler)
