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

binaries:
	bash deploy/localenv/build-binaries.sh

# Debian packages (deploy/system/packages.txt) that only a missing one triggers an install of.
system-packages:
	bash deploy/system/install.sh

# The tests' container images (Temporal, the Debian base, tidepool's own), built into Podman's storage in
# the cache and again only when their inputs change: minutes once, a fraction of a second after.
images: $(STAMP) system-packages
	$(PY) -m deploy.containers.images

# The main job on the local environment; leaves everything running. `make demo-down` stops it.
demo: $(STAMP) binaries system-packages
	$(PY) -m deploy.localenv.demo up

demo-down: $(STAMP)
	$(PY) -m deploy.localenv.demo down

# Every test, the integration ones against real Temporal and Kubernetes included. TEST_WORKERS=2 runs the
# test files on two processes (pytest-xdist), each with a local environment of its own; not yet the default:
# kwokctl takes every cluster's ports from one range, and a cluster a fault test stops and starts again can
# find its ports taken by the other worker's new cluster (4 tests failed so, in a 37-minute run).
TEST_WORKERS ?= 0
test: $(STAMP) binaries system-packages images
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# Only the tests that need no local environment.
test-fast: $(STAMP)
	$(PY) -m pytest -m 'not env' $(PYTEST_ARGS)

env-up: $(STAMP) binaries
	$(PY) -m deploy.localenv.demo up
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
