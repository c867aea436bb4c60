# make bench : set up, build, run the benchmark (CPU default when there is no GPU)
# make test  : set up, build, run the tests
# make       : set up and build
# A virtual environment in $(VENV) holds everything; the extension builds in place (ninja
# rebuilds only what changed), with CUDA kernels when nvcc and a CUDA build of torch are
# there (setup.py decides). The build step also writes a .pth file into the venv's
# site-packages that puts this folder on sys.path, so `import psa_fa2_ext` works from any
# directory with $(VENV)/bin/python. `pip install --no-build-isolation .` installs it instead.
#
# TORCH is the torch requirement, installed in the same pip call as the test requirements so
# that pip picks the torchvision built for it (e.g. TORCH=torch==2.13.0, a CPU-only wheel
# where one lies in pip's find-links). Changing it sets the venv up again.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.14.1
STAMP := $(VENV)/.setup-done

.DEFAULT_GOAL := build
.PHONY: setup build test bench clean FORCE

# The stamp holds the TORCH it was set up with; another TORCH makes it out of date.
SETUP_AGAIN := $(if $(filter-out $(TORCH),$(shell cat $(STAMP) 2>/dev/null)),FORCE)

$(STAMP): requirements-test.txt requirements-ultralytics.txt $(SETUP_AGAIN)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH)" ninja pybind11 setuptools wheel -r requirements-test.txt
	@# PyPI's torchvision wheels are CUDA builds, which fail to import beside a CPU-only torch
	@# (e.g. torch 2.13.0+cpu); without them the Ultralytics tests skip instead of failing.
	@$(PY) -c "import torchvision" 2>/dev/null || { \
	  echo "torchvision does not import beside this torch: uninstalling torchvision and ultralytics (their tests will skip)"; \
	  $(PY) -m pip uninstall -q -y torchvision ultralytics; }
	echo '$(TORCH)' > $@

setup: $(STAMP)

build: setup
	$(PY) setup.py -q build_ext --inplace
	$(PY) -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], 'psa_fa2_ext_inplace.pth').write_text(r'''$(CURDIR)''' + '\n')"
	$(PY) -m psa_fa2_ext

test: build
	$(PY) -m pytest tests -q -ra

bench: build
	$(PY) bench/bench_attention.py

clean:
	rm -rf build *.egg-info psa_fa2_ext/*.so
