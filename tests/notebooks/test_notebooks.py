"""The notebooks run top to bottom (nbclient, a fresh kernel each) and are stored without outputs."""

from __future__ import annotations

import pathlib
import shutil
import tempfile

import nbformat
import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks() -> None:
    names = {p.name for p in NOTEBOOKS}
    assert {"quickstart.ipynb", "flights_read_kinesis.ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_outputs_are_stripped(path: pathlib.Path) -> None:
    book = nbformat.read(path, as_version=4)
    nbformat.validate(book)
    for cell in book.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: outputs not stripped"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_runs_top_to_bottom(path: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPLBACKEND", "Agg")
    ray_tmp = tempfile.mkdtemp(prefix="ka-nb-", dir="/tmp")  # short: Ray's socket paths are limited to 107 bytes
    monkeypatch.setenv("RAY_TMPDIR", ray_tmp)
    try:
        book, error = _execute(path, tmp_path)
        if error and "The current node timed out during startup" in error:  # Ray's fixed 30 s raylet wait,
            book, error = _execute(path, tmp_path)                            # on an overloaded machine: once more
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert error is None, error
    texts = [_text(o) for c in book.cells if c.cell_type == "code" for o in c.outputs]
    for warning in ("IProgress not found", "Missing packages"):  # tqdm and Ray without ipywidgets
        assert not [t for t in texts if warning in t], f"{path.name} printed {warning!r}"


def _execute(path: pathlib.Path, tmp_path: pathlib.Path) -> tuple[nbformat.NotebookNode, str | None]:
    """Run the notebook in a fresh kernel up to its first failing cell: (the notebook, that cell's error or None)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    book = nbformat.read(path, as_version=4)
    client = NotebookClient(book, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    except CellExecutionError as e:
        return book, str(e)
    return book, None


def _text(output: dict) -> str:
    """The text of one cell output: a stream's text or a display's text/plain."""
    if output.get("output_type") == "stream":
        return str(output.get("text", ""))
    return str(output.get("data", {}).get("text/plain", ""))


@pytest.mark.timeout(180)
def test_make_notebooks_serves_them_with_a_kernel(tmp_path: pathlib.Path) -> None:
    """`make notebooks` (the README's way to open them) serves notebooks/ on loopback and starts a kernel."""
    import json
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    root = pathlib.Path(__file__).resolve().parents[2]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = "ka-test"
    if sys.prefix == sys.base_prefix:
        pytest.skip("the tests do not run in a virtualenv: `make notebooks` would create .venv")
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JUPYTER_CONFIG_DIR=str(tmp_path / "config"))
    args = f"--no-browser --port={port} --IdentityProvider.token={token}"
    log = tmp_path / "jupyter.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(["make", "-s", "notebooks", f"VENV={sys.prefix}", f"NOTEBOOK_ARGS={args}"], cwd=root,
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def api(path: str, method: str = "GET") -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/api/{path}", method=method,
                                     headers={"Authorization": f"token {token}"}, data=b"{}" if method == "POST" else None)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
        with opener.open(req, timeout=5) as resp:
            return json.loads(resp.read())

    try:
        deadline = time.monotonic() + 120
        listing = None
        while listing is None:
            assert proc.poll() is None, f"make notebooks exited {proc.returncode}: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, "JupyterLab did not answer within 120 s"
            try:
                listing = api("contents")
            except OSError:
                time.sleep(0.5)
        assert {"quickstart.ipynb", "flights_read_kinesis.ipynb"} <= {c["name"] for c in listing["content"]}
        kernel = api("kernels", method="POST")
        connection_file = tmp_path / "runtime" / f"kernel-{kernel['id']}.json"
        while not connection_file.exists():
            assert time.monotonic() < deadline, f"no connection file for kernel {kernel['id']}"
            time.sleep(0.2)
        from jupyter_client import BlockingKernelClient

        client = BlockingKernelClient(connection_file=str(connection_file))
        client.load_connection_file()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=60)
            printed: list[str] = []
            reply = client.execute_interactive("import sys, kinesis_actors; print(sys.prefix)", timeout=60,
                                               output_hook=lambda m: printed.append(m["content"].get("text", "")))
        finally:
            client.stop_channels()
        assert reply["content"]["status"] == "ok", reply["content"]
        assert "".join(printed).strip() == sys.prefix  # the kernel runs in this venv, where the library is installed
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
