#!/usr/bin/env bash
# The GPU check for a host without network: install the wheelhouse offline, run the CUDA tests and the GPU suite.
#
#   scripts/gpu_check.sh WHEELHOUSE_DIR OUT_DIR [SIZE]     (SIZE: real (default) or tiny)
#
# Run from a checkout of this repository (the tests and benchmarks/ come from it; vlforge itself comes from the
# wheelhouse). PYTHON picks the interpreter that holds the host's torch (default: python3). Writes into OUT_DIR:
# host-packages.txt (the host's packages before the install, the --host input of scripts/wheelhouse.py),
# install.log, pytest-gpu.log + pytest-gpu.xml, gpu_suite.json + gpu_suite.md, and summary.txt.
# TEST_LIMIT and SUITE_LIMIT (seconds, default 420 and 480) bound the two steps.
# Exit status: the first failing step's (install, tests, suite), 0 when all passed.
set -u
WHEELHOUSE=${1:?usage: scripts/gpu_check.sh WHEELHOUSE_DIR OUT_DIR [SIZE]}
OUT=${2:?usage: scripts/gpu_check.sh WHEELHOUSE_DIR OUT_DIR [SIZE]}
SIZE=${3:-real}
PY=${PYTHON:-python3}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
status=0
step() {  # step NAME SECONDS COMMAND...: run with a time limit, record its exit status and seconds
    local name=$1 limit=$2; shift 2
    local begin=$SECONDS rc
    timeout "$limit" "$@"; rc=$?
    echo "$name rc=$rc seconds=$((SECONDS - begin))" | tee -a "$OUT/summary.txt" >&2
    if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
    return "$rc"
}
: > "$OUT/summary.txt"
"$PY" -m pip list --format=freeze > "$OUT/host-packages.txt" 2>/dev/null
# vlforge with the extras the wheelhouse was built for (--extras, e.g. fla) and what it carries beside (--also)
WANT=$("$PY" -c "import json, sys; m = json.load(open(sys.argv[1])); e = ','.join(m.get('extras', [])); \
print(' '.join(['vlforge' + (f'[{e}]' if e else ''), *m['also']]))" "$WHEELHOUSE/manifest.json")
if ! step install 300 "$PY" -m pip install --no-index --find-links "$WHEELHOUSE" --disable-pip-version-check \
        $WANT > "$OUT/install.log" 2>&1; then
    tail -20 "$OUT/install.log"
    exit "$status"
fi
export PYTHONUNBUFFERED=1 VLFORGE_CACHE_DIR=${VLFORGE_CACHE_DIR:-$(mktemp -d)}
"$PY" -c "import torch, transformers, vlforge; print('torch', torch.__version__, 'transformers', \
transformers.__version__, 'vlforge', vlforge.__file__, 'cuda', torch.cuda.is_available())" | tee -a "$OUT/summary.txt"
step pytest_gpu "${TEST_LIMIT:-420}" "$PY" -m pytest -m gpu tests/gpu -q -p no:cacheprovider -o junit_logging=system-out --junitxml "$OUT/pytest-gpu.xml" \
    > "$OUT/pytest-gpu.log" 2>&1
tail -15 "$OUT/pytest-gpu.log"
step gpu_suite "${SUITE_LIMIT:-480}" "$PY" benchmarks/gpu_suite.py --size "$SIZE" --markdown "$OUT/gpu_suite.md" \
    > "$OUT/gpu_suite.json"
cat "$OUT/gpu_suite.md" 2>/dev/null
exit "$status"
