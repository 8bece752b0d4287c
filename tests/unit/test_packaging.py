"""What pyproject.toml claims is what CI runs: the Ray range, the console script's --version, and
`make package` (python -m build, twine check, the wheel in a fresh venv, pip check) wired into CI."""

from __future__ import annotations

import importlib.metadata
import pathlib
import re
import sys

from click.testing import CliRunner
from packaging.requirements import Requirement
from packaging.version import Version

from kinesis_actors.cli import cli

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def ray_requirement() -> Requirement:
    reqs = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    return next(r for r in reqs if r.name == "ray")


def test_the_claimed_ray_range_is_the_ray_ci_runs() -> None:
    spec = ray_requirement().specifier
    installed = Version(importlib.metadata.version("ray"))
    assert installed in spec, f"CI runs Ray {installed}, outside the claimed {spec}"
    lower = min(Version(s.version) for s in spec if s.operator in (">=", "=="))
    assert (lower.major, lower.minor) == (installed.major, installed.minor), \
        f"the claim starts at {lower} but CI only runs {installed}: narrow it or add a smoke stage on {lower}"
    assert Version(f"{installed.major}.{installed.minor + 1}") not in spec, \
        "a newer minor Ray is claimed without being tested"


def test_version_prints_the_package_version() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"kinesis-actors, version {importlib.metadata.version('kinesis-actors')}"


def test_make_package_builds_checks_and_installs_the_wheel_and_ci_runs_it() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^package:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert recipe is not None, "no package target"
    steps = recipe.group(1)
    assert "-m build" in steps and "twine check" in steps and "kinesis-actors --version" in steps
    assert "-m venv $(PKG_VENV)" in steps and "$(PKG_VENV)/bin/pip install -q --no-deps $(DIST)/*.whl" in steps
    assert "$(PKG_VENV)/bin/pip check" in steps, "the wheel's requirements are checked against the tested versions"
    assert re.search(r"^stage package make package$", (ROOT / ".ci" / "run").read_text(), re.MULTILINE)
    test_extra = {Requirement(r).name for r in PYPROJECT["project"]["optional-dependencies"]["test"]}
    assert {"build", "twine"} <= test_extra


def test_an_editable_install_is_a_plain_path_entry() -> None:
    # setuptools' finder-based editable mode emits a warning pip >= 25 prints as a BuildBackendWarning
    assert PYPROJECT["tool"]["setuptools"]["package-dir"] == {"": "."}
