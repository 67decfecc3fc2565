# Every target makes the virtual environment it needs; `make install` is idempotent and
# returns at once when the stamp is newer than the files that define the environment.
#
# Two tested sets of releases (STACK):
#   1.8  torch 2.13.0 (CPU build), FBGEMM 1.8.0, torchrec 1.8.0     -> .venv       (default)
#   1.9  torch 2.14.1, FBGEMM 1.9.0, torchrec 1.9.2 (today's)        -> .venv-1.9
# `make test`, `make demo` use the default set; `make test-1.9` runs the whole suite on the
# other but the parametrizations marked another_size (a path another parametrization runs,
# at another world or host size: what a release changes shows at any size, and it saves
# about a minute of CI's suite); `make test-isa` runs the fast tests under another
# instruction set (see README).
PYTHON_BOOT ?= $(shell command -v python3.11 || command -v python3)
STACK       ?= 1.8
ifeq ($(STACK),1.9)
VENV        := .venv-1.9
TORCH       := 2.14.1
FBGEMM_VER  := 1.9.0
TORCHREC    := 1.9.2
else ifeq ($(STACK),1.8)
VENV        := .venv
TORCH       := 2.13.0
FBGEMM_VER  := 1.8.0
TORCHREC    := 1.8.0
else
$(error STACK=$(STACK) is not a tested set: use STACK=1.8 or STACK=1.9)
endif
CONSTRAINTS := constraints/torchrec-$(STACK).txt
PY          := $(VENV)/bin/python
PIP         := $(PY) -m pip --disable-pip-version-check -q
STAMP       := $(VENV)/.installed
# CUDA machines get the CUDA FBGEMM build; everything else the CPU build (see README).
HAS_CUDA    := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
FBGEMM      := $(if $(HAS_CUDA),fbgemm-gpu==$(FBGEMM_VER),fbgemm-gpu-cpu==$(FBGEMM_VER))
PYTEST_ARGS ?=
# Another instruction set for ATen and MKL than this CPU's best: floats then differ in the
# last bits, as they do on another CPU (an AMD EPYC's MKL path, say). AVX2 where that
# changes this machine's results (benchmarks/isa_bits.py checks), else no vectorisation.
ISA_ENV     ?= ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
ISA_FALLBACK := ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2

.PHONY: install test test-fast test-isa test-1.9 demo lint format bench clean

install: $(STAMP)

# The package itself is installed with its dependencies resolved (not --no-deps) and the
# environment is compared before and after: installing it must change none of the user's
# packages (torch, FBGEMM, torchrec above all).
$(STAMP): setup.py requirements.txt $(CONSTRAINTS) Makefile
	test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PIP) install -c $(CONSTRAINTS) torch==$(TORCH)
	$(PIP) install -c $(CONSTRAINTS) $(FBGEMM)
	$(PIP) install -c $(CONSTRAINTS) --no-deps torchrec==$(TORCHREC)
	$(PIP) install -c $(CONSTRAINTS) -r requirements.txt
	$(PY) -m pip freeze --exclude torchrec-dreamshard > $(VENV)/.before-package
	$(PIP) install --no-build-isolation -e .
	$(PY) -m pip freeze --exclude torchrec-dreamshard > $(VENV)/.after-package
	diff $(VENV)/.before-package $(VENV)/.after-package || \
	  { echo "installing torchrec-dreamshard changed the packages above"; exit 1; }
	$(PY) -c "import torchrec_dreamshard, torchrec, fbgemm_gpu; print('environment ok')"
	touch $@

test: install
	$(PY) -m pytest -q $(PYTEST_ARGS) tests

test-fast: install
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS) tests

test-isa: install
	isa="$(ISA_ENV)"; \
	$(PY) benchmarks/isa_bits.py --against "$$isa" || isa="$(ISA_FALLBACK)"; \
	$(PY) benchmarks/isa_bits.py --against "$$isa" && \
	echo "fast tests under $$isa" && env $$isa $(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS) tests

test-1.9:
	$(MAKE) test STACK=1.9 PYTEST_ARGS='-m "not another_size" $(PYTEST_ARGS)'

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
	rm -rf .venv .venv-1.9 *.egg-info .pytest_cache .ruff_cache
