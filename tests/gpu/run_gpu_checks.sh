#!/usr/bin/env bash
# Everything that needs a real GPU, in one run with a time limit per step: the
# machine's versions, the compiled call bridge (built in place for this Python
# if it is not), the GPU suite, the GPU benchmarks, the demo's kernels,
# numba-cuda's own tests with the plugin, and the speed report's start-up and
# pair figures on this machine's CPU. For a session with a GPU for minutes.
#
# Usage:   tests/gpu/run_gpu_checks.sh [OUTPUT_DIR]      (from anywhere)
# Env:     PYTHON (default python3); T_BUILD, T_TESTS, T_BENCH, T_DEMO, T_SUITE,
#          T_CPU: seconds per step (120, 200, 150, 45, 140, 150).
# Output:  OUTPUT_DIR/{gpu_tests.log,gpu_tests.xml,gpu_bench.log,bench.json,
#          demo.log,cpu.log}, OUTPUT_DIR/suite/ (run_numba_cuda_suite.sh), and on stdout
#          what failed, the benchmark tables and the interleaved groups' figures.
#          Needs the 'test' extra's pytest, pytest-benchmark, hypothesis and filecheck,
#          and numba-cuda with a NumPy it supports (numba-cuda 0.30.4 compiles no
#          kernel with NumPy 2.5: no np.row_stack).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${1:-$ROOT/gpu_check_results}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
export PYTHONPATH="$ROOT:$ROOT/tests/gpu${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cd "$ROOT"
T0=$(date +%s)
step() { echo; echo "=== [$(( $(date +%s) - T0 ))s] $*"; }

step machine
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
"$PY" - <<'PYEOF'
import importlib.metadata as md, platform
print("python", platform.python_version())
for name in ("numba", "numba-cuda", "numpy", "cuda-bindings", "cuda-core", "cupy-cuda13x",
             "cupy-cuda12x", "pytest"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        pass
PYEOF

step call bridge
# The bridge is the C extension allocators._fastpath, which allocators._fastcall
# uses where it imports. A checkout carried to another machine has none built for
# that Python, and the allocators would then serve every call from Python.
built='import numba_bfc.allocators._fastcall as f; print(f.KernelEntry is not None)'
if [ "$("$PY" -c "$built")" != True ]; then
    # The extension is optional (setup.py): a failed compile still exits 0, so the
    # import below is what tells.
    timeout "${T_BUILD:-120}" "$PY" setup.py -q build_ext --inplace > "$OUT/bridge_build.log" 2>&1
    echo "built in place: exit status $? (log: bridge_build.log)"
fi
"$PY" -c 'import numba_bfc.allocators._fastcall as f
print("call bridge built:", f.KernelEntry is not None, "- in use:", f.native_enabled())'

step GPU suite
timeout "${T_TESTS:-200}" "$PY" -m pytest -p no:cacheprovider -m cuda tests/gpu -v -rfEs \
    --durations=12 --junitxml="$OUT/gpu_tests.xml" > "$OUT/gpu_tests.log" 2>&1
echo "exit status $?"
grep -E "^(FAILED|ERROR) " "$OUT/gpu_tests.log"
tail -n 1 "$OUT/gpu_tests.log"

step GPU benchmarks
timeout "${T_BENCH:-150}" "$PY" -m pytest -p no:cacheprovider -m cuda benchmarks/gpu -q -rfEs \
    --benchmark-max-time=0.3 --benchmark-columns=min,median,mean,rounds \
    --benchmark-group-by=group --benchmark-json="$OUT/bench.json" > "$OUT/gpu_bench.log" 2>&1
echo "exit status $?"
grep -E "^(FAILED|ERROR) |^test_|^Name" "$OUT/gpu_bench.log" | cut -c1-160
# The interleaved groups' figures are in extra_info, not in the table.
[ -s "$OUT/bench.json" ] && "$PY" - "$OUT/bench.json" <<'PYEOF' || true
import json, sys
for bench in json.load(open(sys.argv[1]))["benchmarks"]:
    if bench["group"].endswith("-interleaved"):
        print(bench["name"], json.dumps(bench["extra_info"]))
PYEOF

step demo
timeout "${T_DEMO:-45}" "$PY" -m numba_bfc demo > "$OUT/demo.log" 2>&1
echo "exit status $?"
sed -n '3,6p' "$OUT/demo.log"

step numba-cuda suite
PYTHON="$PY" timeout "${T_SUITE:-140}" bash tests/gpu/run_numba_cuda_suite.sh "$OUT/suite" \
    > "$OUT/suite.log" 2>&1
echo "exit status $?"
sed -n '/^| configuration/,/^## Failing with both/p' "$OUT/suite/summary.md" 2>/dev/null

step CPU: start-up and pair
timeout "${T_CPU:-150}" "$PY" benchmarks/speed_report.py --sections start,pair --rounds 3 \
    > "$OUT/cpu.log" 2>&1
echo "exit status $?"
grep -E "^\| " "$OUT/cpu.log"
step done
