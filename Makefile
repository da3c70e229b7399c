# vlforge set-up. `make demo` and `make test` work on a fresh machine with Python >= 3.10.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
PIP_FLAGS := --quiet --disable-pip-version-check -c constraints.txt

.PHONY: demo test lint venv install install-dev bench wheelhouse matrix clean

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

# Two workers by default (the 2-core CI machine); TEST_WORKERS=0 runs in one process. A test file stays on one
# worker (its module fixtures - a training run, a torchrun launch - are built once; a docs page's blocks use
# each other's files), files with more slow tests first (tests/conftest.py). Every test's seconds
# (setup + call + teardown) land in TEST_REPORT (JUnit XML).
TEST_WORKERS ?= 2
TEST_REPORT ?= .pytest-report.xml
# Bytecode of the repository's own modules is written first: with PYTHONDONTWRITEBYTECODE set (as on the CI
# machine) no process writes it, and each of the suite's hundreds of subprocesses would compile vlforge again
# (~0.5-1 s each; pip already compiled the installed packages).
test: install-dev lint
	$(BIN)/python -m compileall -q -j 0 src tests benchmarks scripts
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=40 --junitxml $(TEST_REPORT)

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

# The version matrix (README "Supported versions"): fresh venvs under ~/.cache/vlforge/matrix, vlforge from its
# built wheel, the core suite on the oldest and newest transformers and on the oldest and newest torch, the
# one-line refusal of an older transformers and of an older torch, and the offline wheelhouse install into a venv
# holding only torch. 15-45 minutes on 2 cores, by machine (the torch points download CUDA builds: network needed).
MATRIX_POINTS ?= oldest,newest,torch_oldest,torch_newest,below,torch_below,offline
matrix: install
	$(BIN)/python scripts/version_matrix.py --points $(MATRIX_POINTS) --record benchmarks/records/version_matrix.json

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .ruff_cache
