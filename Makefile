# The README's two commands: `make demo` and `make test`. Both set up .venv when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
# pytest workers: parallel where it helps (2 cores on CI)
WORKERS ?= 2

.PHONY: demo test lint typecheck pytest pytest-cuda bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch: the pinned build this machine's pip offers from disk; any newer torch elsewhere.
	$(PIP) install --disable-pip-version-check -q torch==2.14.1 torchvision==0.29.1 \
	  || $(PIP) install --disable-pip-version-check -q torch torchvision
	$(PIP) install --disable-pip-version-check -q -e '.[dev,all]'
	# MOSES benchmark files (graphcl --data moses*); --no-deps: its other pins are not needed.
	$(PIP) install --disable-pip-version-check -q --no-deps molsets==0.3.1
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/tour.py

test: $(STAMP) lint typecheck pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

pytest: $(STAMP)
	$(PY) -m pytest -q -n $(WORKERS) --durations=30 tests
	# the GPU tests' bodies on the CPU, so they cannot rot on machines without CUDA
	CONTRASTKIT_TEST_DEVICE=cpu $(PY) -m pytest -q -n $(WORKERS) -m cuda tests

# on a machine with CUDA: the GPU tests alone
pytest-cuda: $(STAMP)
	$(PY) -m pytest -q -p no:xdist -m cuda -rs tests

bench: $(STAMP)
	$(PIP) install --disable-pip-version-check -q -e '.[dev,all,bench]'
	$(PY) benchmarks/losses.py

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
