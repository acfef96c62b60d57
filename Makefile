# The two set-up commands of the README: `make demo` and `make test`.
# Each creates .venv (if missing), installs torch 2.13.0 (the CPU wheel) first, then ctrkit, then runs.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip install -q --disable-pip-version-check

# torchrec (the sharded embedding backend, ctrkit[distributed]) names the CUDA build of fbgemm-gpu: it goes in
# --no-deps after torch, with the CPU build fbgemm-gpu-cpu 1.8.0 (the release whose kernels load against torch
# 2.13.0), every pip call held to torch==2.13.0 by a constraints file.
$(BIN)/ctrkit: pyproject.toml
	$(PY) -m venv $(VENV)
	printf 'torch==2.13.0\n' > $(VENV)/constraints.txt
	$(PIP) torch==2.13.0
	$(PIP) -c $(VENV)/constraints.txt -e '.[test,gbdt,distributed]'
	$(PIP) -c $(VENV)/constraints.txt --no-deps torchrec==1.9.2 fbgemm-gpu-cpu==1.8.0
	touch $@

.PHONY: install demo test lint
install: $(BIN)/ctrkit

demo: install
	$(BIN)/ctrkit demo

# tests/report renders run reports in headless Chromium (Debian package chromium): installed when missing,
# as root or through sudo.
APT_CHROMIUM := apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium

test: install
	@command -v chromium >/dev/null 2>&1 || { echo "installing chromium (for tests/report)"; \
	  if [ "$$(id -u)" = 0 ]; then $(APT_CHROMIUM); else sudo sh -c '$(APT_CHROMIUM)'; fi; }
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/pip install -q ruff && $(BIN)/ruff check src tests benchmarks
