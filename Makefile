# The two commands a fresh machine needs: `make demo` and `make test`. Each installs what it uses:
# a Python virtualenv with the pinned packages, and the control-plane binaries (built once, then cached).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo demo-down test test-fast binaries system-packages images env-up env-down env-status crds lint

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# The control plane, etcd, kwok and the kubelet (the demo's and the realnode tests' real nodes), built once.
binaries:
	bash deploy/localenv/build-binaries.sh --with-kubelet

# Debian packages (deploy/system/packages.txt) that only a missing one triggers an install of.
system-packages:
	bash deploy/system/install.sh

# The tests' container images (Temporal, the Debian base, tidepool's own), built into Podman's storage in
# the cache and again only when their inputs change: minutes once, a fraction of a second after.
images: $(STAMP) system-packages
	$(PY) -m deploy.containers.images

# The main job on the local environment; leaves everything running. `make demo-down` stops it. Its real
# nodes need root; DEMO_ARGS=--no-real-nodes runs it without them.
demo: $(STAMP) binaries system-packages images
	$(PY) -m deploy.localenv.demo up $(DEMO_ARGS)

demo-down: $(STAMP)
	$(PY) -m deploy.localenv.demo down

# Every test, the integration ones against real Temporal and Kubernetes included, on TEST_WORKERS processes
# (pytest-xdist), each with a local environment of its own (its clusters on ports of its own). Whole files
# go to the workers, longest first by tests/durations.json (`--no-loadscope-reorder` keeps that order;
# refresh the file with PYTEST_ARGS=--store-durations after adding long tests). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 3
test: $(STAMP) binaries system-packages images
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# Only the tests that need no local environment.
test-fast: $(STAMP)
	$(PY) -m pytest -m 'not env' $(PYTEST_ARGS)

env-up: $(STAMP) binaries system-packages images
	$(PY) -m deploy.localenv.demo up $(DEMO_ARGS)
env-down: $(STAMP)
	$(PY) -m deploy.localenv.demo down
env-status: $(STAMP)
	$(PY) -m deploy.localenv status

crds: $(STAMP)
	$(PY) -m deploy.crdgen

# ruff, the import contracts and mypy --strict ([tool.mypy] in pyproject.toml says what it checks).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy
