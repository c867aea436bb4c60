# make bench : set up, build, run the benchmark (CPU default when there is no GPU)
# make test  : set up, build, run the tests
# A virtual environment in $(VENV) holds everything; the extension builds in place (ninja
# rebuilds only what changed), with CUDA kernels when nvcc and a CUDA build of torch are
# there (setup.py decides). `pip install --no-build-isolation .` installs it instead.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.14.1

.PHONY: setup build test bench clean

$(VENV)/.setup-done: requirements-test.txt requirements-ultralytics.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH)" ninja pybind11 setuptools wheel -r requirements-test.txt
	touch $@

setup: $(VENV)/.setup-done

build: setup
	$(PY) setup.py -q build_ext --inplace
	$(PY) -m psa_fa2_ext

test: build
	$(PY) -m pytest tests -q -ra

bench: build
	$(PY) bench/bench_attention.py

clean:
	rm -rf build *.egg-info psa_fa2_ext/*.so
