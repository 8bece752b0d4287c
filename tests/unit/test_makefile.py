"""The README's make targets install what each needs, checked with ``make -n`` (nothing runs)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _plan(target: str, tmp_path: pathlib.Path) -> str:
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    venv = tmp_path / "venv"  # does not exist: make plans the venv and the install
    out = subprocess.run(["make", "-n", target, f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout


@pytest.mark.parametrize(("target", "extra"), [("demo", "demo"), ("notebooks", "notebooks"), ("test-fast", "test")])
def test_each_target_installs_its_own_extra(target: str, extra: str, tmp_path: pathlib.Path) -> None:
    plan = _plan(target, tmp_path)
    installs = [line for line in plan.splitlines() if "pip install" in line and "-e" in line]
    assert installs == [f'{tmp_path / "venv"}/bin/pip install -q -e ".[{extra}]"'], plan


def test_notebooks_listen_on_loopback(tmp_path: pathlib.Path) -> None:
    plan = _plan("notebooks", tmp_path)
    assert "--ServerApp.ip=127.0.0.1" in plan and "--ServerApp.root_dir=notebooks" in plan
