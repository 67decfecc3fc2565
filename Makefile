# Every target makes the virtual environment it needs; `make install` is idempotent and
# returns at once when the stamp is newer than the files that define the environment.
PYTHON_BOOT ?= $(shell command -v python3.11 || command -v python3)
VENV        := .venv
PY          := $(VENV)/bin/python
PIP         := $(PY) -m pip --disable-pip-version-check -q
STAMP       := $(VENV)/.installed
# CUDA machines get the CUDA FBGEMM build; everything else the CPU build (see README).
HAS_CUDA    := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
FBGEMM      := $(if $(HAS_CUDA),fbgemm-gpu==1.8.0,fbgemm-gpu-cpu==1.8.0)
PYTEST_ARGS ?=

.PHONY: install test test-fast demo lint format bench clean

install: $(STAMP)

$(STAMP): setup.py requirements.txt constraints.txt Makefile
	test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PIP) install -c constraints.txt torch==2.13.0
	$(PIP) install -c constraints.txt $(FBGEMM)
	$(PIP) install -c constraints.txt --no-deps torchrec==1.8.0
	$(PIP) install -c constraints.txt -r requirements.txt
	$(PIP) install -c constraints.txt --no-deps --no-build-isolation -e .
	$(PY) -c "import torchrec_dreamshard, torchrec, fbgemm_gpu; print('environment ok')"
	touch $@

test: install
	$(PY) -m pytest -q $(PYTEST_ARGS) tests

test-fast: install
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS) tests

demo: install
	$(VENV)/bin/dreamshard demo

lint: install
	$(VENV)/bin/ruff check torchrec_dreamshard tests benchmarks
	$(VENV)/bin/ruff format --check torchrec_dreamshard tests benchmarks

format: install
	$(VENV)/bin/ruff check --fix torchrec_dreamshard tests benchmarks
	$(VENV)/bin/ruff format torchrec_dreamshard tests benchmarks

bench: install
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache
