# Two entry points (README.md): `make demo` sets up and runs the main job, `make test` runs the tests.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python

.PHONY: demo test clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and pinned: an unpinned torch pulls the CUDA build (several GB).
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

demo: $(VENV)/.installed
	$(PY) tools/demo.py --out out/demo

# Two workers (CI has 2 cores), whole files to one worker so module fixtures are built once; tests on
# lavapipe run with the other worker waiting (tests/conftest.py).
TEST_WORKERS ?= 2

test: $(VENV)/.installed
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=40 tests

clean:
	rm -rf out
