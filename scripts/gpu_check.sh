#!/usr/bin/env bash
# The GPU check for a host without network, in one device call: install the wheelhouse offline, measure `vlforge
# train` beside its peers, run the GPU suite, then the CUDA tests with the time that is left.
#
#   scripts/gpu_check.sh WHEELHOUSE_DIR OUT_DIR [SIZE]     (SIZE: real (default) or tiny)
#
# Run from a checkout of this repository (the tests and benchmarks/ come from it; vlforge itself comes from the
# wheelhouse). PYTHON picks the interpreter that holds the host's torch (default: python3). Writes into OUT_DIR:
# host-packages.txt (the host's packages before the install, the --host input of scripts/wheelhouse.py),
# install.log, train_gpu.json + train_gpu.log (benchmarks/train_gpu.py: copy the JSON to
# benchmarks/records/train_gpu_<gpu>.json), gpu_suite.json + gpu_suite.md + traces/ (the patch embedding's profiler
# traces), pytest-gpu.log + pytest-gpu.xml, and summary.txt.
# Time: TOTAL_LIMIT (default 470 s) bounds the whole call; INSTALL_LIMIT (90), BENCH_LIMIT (200) and SUITE_LIMIT (60)
# bound those steps and the tests get what is left (TEST_LIMIT caps it further). Every limit interrupts with SIGINT
# first: pytest then still writes its summary and XML, and the benchmark has written its record after every run.
# BENCH_ARGS replaces the benchmark's variant and peer choice (default below).
# Exit status: the first failing step's (install, train_gpu, gpu_suite, tests), 0 when all passed.
set -u
WHEELHOUSE=${1:?usage: scripts/gpu_check.sh WHEELHOUSE_DIR OUT_DIR [SIZE]}
OUT=${2:?usage: scripts/gpu_check.sh WHEELHOUSE_DIR OUT_DIR [SIZE]}
SIZE=${3:-real}
PY=${PYTHON:-python3}
TOTAL=${TOTAL_LIMIT:-470}
BENCH=${BENCH_LIMIT:-200}
BENCH_ARGS=${BENCH_ARGS:---variants eager,compile,liger,compile+liger,selective,full,compile+selective,bf16_states \
--variants-media eager,compile+liger --peers trainer,lmms --peer-data text,image}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
status=0
step() {  # step NAME SECONDS COMMAND...: run with a time limit (SIGINT, then SIGKILL 15 s later), record it
    local name=$1 limit=$2; shift 2
    local begin=$SECONDS rc
    if [ "$limit" -le 0 ]; then
        echo "$name rc=skipped seconds=0 (no time left of TOTAL_LIMIT=$TOTAL)" | tee -a "$OUT/summary.txt" >&2
        return 0
    fi
    timeout -s INT -k 15 "$limit" "$@"; rc=$?
    echo "$name rc=$rc seconds=$((SECONDS - begin))" | tee -a "$OUT/summary.txt" >&2
    if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
    return "$rc"
}
left() {  # left CAP: the seconds of TOTAL_LIMIT still unspent, at most CAP
    local rest=$((TOTAL - SECONDS))
    echo $((rest < $1 ? rest : $1))
}
: > "$OUT/summary.txt"
"$PY" -m pip list --format=freeze > "$OUT/host-packages.txt" 2>/dev/null
# vlforge with the extras the wheelhouse was built for (--extras, e.g. fla,liger) and what it carries beside (--also)
WANT=$("$PY" -c "import json, sys; m = json.load(open(sys.argv[1])); e = ','.join(m.get('extras', [])); \
print(' '.join(['vlforge' + (f'[{e}]' if e else ''), *m['also']]))" "$WHEELHOUSE/manifest.json")
if ! step install "$(left "${INSTALL_LIMIT:-90}")" "$PY" -m pip install --no-index --find-links "$WHEELHOUSE" \
        --disable-pip-version-check $WANT > "$OUT/install.log" 2>&1; then
    tail -20 "$OUT/install.log"
    exit "$status"
fi
export PYTHONUNBUFFERED=1 VLFORGE_CACHE_DIR=${VLFORGE_CACHE_DIR:-$(mktemp -d)}
"$PY" -c "import torch, transformers, vlforge; print('torch', torch.__version__, 'transformers', \
transformers.__version__, 'vlforge', vlforge.__file__, 'cuda', torch.cuda.is_available())" | tee -a "$OUT/summary.txt"
limit=$(left "$BENCH")
# shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
step train_gpu "$limit" "$PY" benchmarks/train_gpu.py --size "$SIZE" $BENCH_ARGS --budget-seconds $((limit * 3 / 4)) \
    --out "$OUT/train_gpu.json" > "$OUT/train_gpu.log" 2>&1
tail -5 "$OUT/train_gpu.log"
step gpu_suite "$(left "${SUITE_LIMIT:-60}")" "$PY" benchmarks/gpu_suite.py --size "$SIZE" --trace-dir "$OUT/traces" \
    --markdown "$OUT/gpu_suite.md" > "$OUT/gpu_suite.json"
cat "$OUT/gpu_suite.md" 2>/dev/null
# the levers' tests first: with the time that is left the older ones may not all run (their names are in the XML)
step pytest_gpu "$(left "${TEST_LIMIT:-420}")" "$PY" -m pytest -m gpu tests/gpu/test_cuda_levers.py \
    tests/gpu/test_cuda_training.py tests/gpu/test_cuda_paths.py tests/gpu/test_cuda_linear_attention.py -q \
    -p no:cacheprovider -o junit_logging=system-out --junitxml "$OUT/pytest-gpu.xml" > "$OUT/pytest-gpu.log" 2>&1
tail -15 "$OUT/pytest-gpu.log"
exit "$status"
