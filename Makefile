# Two commands for a fresh machine (see README):  make demo   /   make test
# Each target installs the extra it needs into .venv: demo -> [demo], notebooks -> [notebooks], the rest -> [test].
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
export RAY_AUTH_MODE ?= disabled
export RAY_USAGE_STATS_ENABLED ?= 0
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER ?= 0

SEEDS ?= 0-1999

.PHONY: sim sim-mutants install lint demo notebooks test test-fast test-integration test-bench-harness test-kinesalite test-kinesis-mock test-notebooks test-cluster test-chaos test-docs docs package bench clean

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# jupyterlab (the notebooks and test extras) pulls in jsonschema's format-nongpl extra, whose
# rfc3987-syntax builds a lark grammar at import: 1.7 CPU s in every Ray process (jsonschema is
# imported by Ray itself), enough on 2 loaded cores to make Ray's raylet give up on its dashboard
# agent. Nothing here needs IRI format checks, so the venv goes without it (a plain
# `pip install kinesis-actors` never had it).
$(VENV)/.installed-%: pyproject.toml | $(BIN)/activate
	$(BIN)/pip install -q -e ".[$*]"
	$(BIN)/pip uninstall -q -y rfc3987-syntax 2>/dev/null || true
	touch $@

install: $(VENV)/.installed-test

demo: $(VENV)/.installed-demo
	$(BIN)/kinesis-actors demo $(ARGS)

# JupyterLab on 127.0.0.1 over notebooks/ (prints its URL with a token); NOTEBOOK_ARGS=--no-browser on a remote machine.
# As root (containers, CI) Jupyter refuses to start without --allow-root.
notebooks: $(VENV)/.installed-notebooks
	$(BIN)/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.root_dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root) $(NOTEBOOK_ARGS)

lint: install  # ruff (pyproject.toml) and mypy (strict on leases, reader, Coordinator, kinesis)
	$(BIN)/ruff check kinesis_actors tests bench examples
	$(BIN)/mypy

test-fast: install
	$(BIN)/python -m pytest tests/unit tests/contract tests/sim $(PYTEST_ARGS)

# The deterministic simulator (tests/sim, docs/simulation.md): SEEDS=A-B seeds, each a seeded history of
# real Coordinator and reader cores on virtual time, checked against the invariants; exits 1 on any violation.
sim: install
	PYTHONHASHSEED=0 $(BIN)/python -m tests.sim --seeds $(SEEDS) $(SIM_ARGS)
	PYTHONHASHSEED=0 $(BIN)/python -m tests.sim --figures

# Every mutant registered in kinesis_actors.mutation, planted in turn over seeds from 0 until a violation
# catches it (at most 500 each; a catch counts only if the seed is clean unplanted); exits 0 only if every
# one is caught. --stuck adds the stuck pool thread, the one fault that shows a silent read loop.
sim-mutants: install
	PYTHONHASHSEED=0 $(BIN)/python -m tests.sim --mutants --stuck --seeds 0-499 $(SIM_ARGS)

test-integration: install
	$(BIN)/python -m pytest tests/integration -m "not kinesalite and not kinesis_mock and not bench_harness" $(PYTEST_ARGS)

test-bench-harness: install  # the bench harness and the slow peers (kcl-rs in its own virtualenv) on tiny inputs
	$(BIN)/python -m pytest tests/integration -m bench_harness $(PYTEST_ARGS)

KINESALITE := tests/kinesalite
$(KINESALITE)/node_modules/.installed: $(KINESALITE)/package-lock.json
	cd $(KINESALITE) && npm ci --omit=optional --no-audit --no-fund
	touch $@

test-kinesalite: install $(KINESALITE)/node_modules/.installed  # resharding etc. on kinesalite (npm); fails if it cannot start
	KINESALITE_REQUIRED=1 $(BIN)/python -m pytest tests/integration -m kinesalite $(PYTEST_ARGS)

# Enhanced fan-out on kinesis-mock (npm kinesis-local, pinned in kinesis_actors/emulator/kinesis_local/);
# installed with npm ci into ~/.cache/kinesis-actors (or $$KINESIS_ACTORS_CACHE) on first use; fails if it cannot start
test-kinesis-mock: install
	KINESIS_MOCK_REQUIRED=1 $(BIN)/python -m pytest tests/integration -m kinesis_mock $(PYTEST_ARGS)

test-notebooks: install  # notebooks/ run top to bottom with nbclient (outputs stripped in the repo)
	$(BIN)/python -m pytest tests/notebooks $(PYTEST_ARGS)

test-cluster: install  # cluster/: manifests offline; a real `ray start --head` + `ray job submit` on loopback
	$(BIN)/python -m pytest tests/cluster $(PYTEST_ARGS)

test-chaos: install  # tests/chaos: kill readers, Coordinators, nodes, drivers on a multi-node Ray cluster -> build/chaos.json
	$(BIN)/python -m pytest tests/chaos $(PYTEST_ARGS)

test: install lint sim sim-mutants $(KINESALITE)/node_modules/.installed  # the suites .ci/run runs stage by stage (which also builds the package and the docs site): lint, the simulator, one pytest session, then the chaos suite's own
	KINESALITE_REQUIRED=1 KINESIS_MOCK_REQUIRED=1 $(BIN)/python -m pytest tests $(PYTEST_ARGS)
	$(BIN)/python -m pytest tests/chaos $(PYTEST_ARGS)

# The documentation site (mkdocs.yml, docs/) into build/site: the benchmark page and its charts are generated
# from bench/results.json first, then `mkdocs build --strict` fails on any warning (a broken link, a docstring
# mkdocstrings cannot read). The docs extra is part of the test extra.
docs: install
	$(BIN)/python -m bench.report --docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The built site in headless Chromium (Debian's chromium + chromium-driver; .ci/run installs them) -> build/docs-screenshots/
test-docs: docs
	DOCS_BROWSER_REQUIRED=1 $(BIN)/python -m pytest tests/docs $(PYTEST_ARGS)

# The sdist and the wheel (python -m build), twine check, then the wheel alone in a fresh venv answers
# `kinesis-actors --version`. That venv sees the test venv's packages through a .pth line (so the
# dependencies are not downloaded and installed a second time) and `pip check` verifies that the wheel's
# requirements are met by exactly the versions the tests ran with.
DIST := build/dist
PKG_VENV := build/package-venv
package: install
	rm -rf $(DIST) $(PKG_VENV)
	$(BIN)/python -m build --outdir $(DIST) .
	$(BIN)/python -m twine check --strict $(DIST)/*
	$(PYTHON) -m venv $(PKG_VENV)
	$(BIN)/python -c "import sys; print(*[p for p in sys.path if p.endswith('site-packages')], sep='\n')" \
	  > $$(echo $(PKG_VENV)/lib/python*/site-packages)/test-venv.pth
	$(PKG_VENV)/bin/pip install -q --no-deps $(DIST)/*.whl
	$(PKG_VENV)/bin/pip check
	$(PKG_VENV)/bin/kinesis-actors --version
	cd $(PKG_VENV) && bin/python -c "import kinesis_actors, sys; assert '/site-packages/' in kinesis_actors.__file__, kinesis_actors.__file__"

bench: install  # benchmarks -> table + bench/results.json (BENCH_ARGS=--quick for a tiny run)
	$(BIN)/python -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache $(DIST) $(PKG_VENV)
