# vlforge set-up. `make demo` and `make test` work on a fresh machine with Python >= 3.10.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
PIP_FLAGS := --quiet --disable-pip-version-check -c constraints.txt

.PHONY: demo test lint venv install install-dev bench wheelhouse clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch is installed first and pinned through constraints.txt so that nothing later replaces it.
$(VENV)/.installed: $(BIN)/python pyproject.toml constraints.txt
	$(PIP) install $(PIP_FLAGS) "torch==2.13.0"
	$(PIP) install $(PIP_FLAGS) -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) install $(PIP_FLAGS) -e ".[dev]"
	touch $@

venv: $(BIN)/python
install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: install
	$(BIN)/vlforge demo

lint: install-dev
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/lint-imports

# Two workers by default (the 2-core CI machine); TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
test: install-dev lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --durations=40

bench: install
	$(BIN)/python benchmarks/patch_embed.py

# Offline wheelhouse for a GPU host with torch (README "GPU host without network"): vlforge + what the host lacks.
# HOST_PACKAGES: the host's `python -m pip list --format=freeze` (empty: a host with torch alone).
WHEEL_PYTHON ?= 3.12
WHEEL_PLATFORM ?=
HOST_PACKAGES ?=
WHEEL_EXTRAS ?=
WHEEL_MAX_MB ?= 64
wheelhouse: install
	$(BIN)/python scripts/wheelhouse.py --out dist/wheelhouse --python-version $(WHEEL_PYTHON) --also pytest \
		--max-mb $(WHEEL_MAX_MB) $(if $(HOST_PACKAGES),--host $(HOST_PACKAGES)) $(if $(WHEEL_EXTRAS),--extras $(WHEEL_EXTRAS)) \
		$(foreach p,$(WHEEL_PLATFORM),--platform $(p))

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .ruff_cache
