#!/usr/bin/env bash
# Run numba-cuda's own allocation-related test modules with numba_bfc as Numba's
# memory manager (NUMBA_CUDA_MEMORY_MANAGER=numba_bfc), and, as a baseline, with
# Numba's default manager; record pass/fail per test and list the tests that
# fail only with numba_bfc.
#
# Usage:   tests/gpu/run_numba_cuda_suite.sh [OUTPUT_DIR]
# Needs:   an NVIDIA GPU, numba-cuda (with its tests, as in the wheel), pytest and
#          filecheck (numba.cuda.testing imports it: pip install filecheck).
# Env:     PYTHON (default: python), NUMBA_BFC_EMM_MODULE (default: numba_bfc),
#          NUMBA_BFC_CONF (passed through: e.g. policy:caching,backend:virtual),
#          SKIP_BASELINE=1 to run only the numba_bfc configuration,
#          NUMBA_BFC_FAKE_CUDA=1 to run on the fake CUDA driver (tests/gpu/
#          fake_libcuda.c) instead of a GPU: tests that launch kernels then fail
#          under both managers, so compare the two columns.
# Output:  OUTPUT_DIR/{numba_bfc,default}.xml (JUnit), .log, manager-*.txt,
#          summary.md. Exit status 0 when no test fails only with numba_bfc,
#          except those that fail with any pool (ANY_POOL below, with reasons).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${1:-$ROOT/numba_cuda_suite_results}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python}
# A relative interpreter path must still name it after the cd into the work folder.
if [[ $PY == */* ]]; then PY=$(CDPATH= cd "$(dirname "$PY")" && pwd)/$(basename "$PY"); fi
MODULE=${NUMBA_BFC_EMM_MODULE:-numba_bfc}
export PYTHONPATH="$ROOT:$ROOT/tests/gpu${PYTHONPATH:+:$PYTHONPATH}"

TESTS=(
  numba.cuda.tests.cudadrv.test_emm_plugins
  numba.cuda.tests.cudadrv.test_cuda_memory
  numba.cuda.tests.cudadrv.test_deallocations
  numba.cuda.tests.cudadrv.test_context_stack
  numba.cuda.tests.cudadrv.test_managed_alloc
  numba.cuda.tests.cudadrv.test_host_alloc
  numba.cuda.tests.cudadrv.test_pinned
  numba.cuda.tests.cudadrv.test_reset_device
  numba.cuda.tests.cudadrv.test_cuda_ndarray
  numba.cuda.tests.cudadrv.test_cuda_array_slicing
  numba.cuda.tests.cudadrv.test_array_attr
  numba.cuda.tests.cudapy.test_ipc
  numba.cuda.tests.cudapy.test_cuda_array_interface
)

# Fail early, with a reason, rather than with 300 identical errors.
"$PY" - "$MODULE" <<'EOF'
import importlib, sys
import fake_cuda
if fake_cuda.requested():
    fake_cuda.preload()
mod = sys.argv[1]
try:
    cls = importlib.import_module(mod)._numba_memory_manager
except Exception as e:
    sys.exit(f"preflight: {mod}._numba_memory_manager is not importable: {e!r}")
try:
    import filecheck  # noqa: F401
except ImportError:
    sys.exit("preflight: numba.cuda.testing needs the 'filecheck' package (pip install filecheck)")
from numba import cuda
if getattr(cuda, "implementation", None) != "NVIDIA":
    sys.exit("preflight: numba-cuda is not installed (numba.cuda is numba's built-in target)")
if not cuda.is_available():
    sys.exit(f"preflight: no usable CUDA GPU: {cuda.cuda_error()}")
if fake_cuda.requested():
    print("preflight: on the fake CUDA driver (no kernels can run)")
print(f"preflight: {mod} -> {cls.__module__}.{cls.__qualname__}")
EOF

# numba-cuda's CUDATestCase needs a fixture and an option that live in the
# repository's conftest, which the wheel does not ship; the tests also need
# namespace-package collection. The stand-in is loaded as a plugin (-p): pytest
# reads no conftest.py from the working directory for tests given by --pyargs
# (seen with pytest 9.1 on a GPU machine).
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cat > "$WORK/pytest.ini" <<'EOF'
[pytest]
consider_namespace_packages = true
EOF
cat > "$WORK/numba_bfc_suite_plugin.py" <<'EOF'
import os

import fake_cuda
import pytest

if fake_cuda.requested():
    fake_cuda.preload()  # before numba.cuda is imported


def pytest_addoption(parser):
    parser.addoption("--dump-failed-filechecks", action="store_true")


@pytest.fixture(scope="class")
def initialize_from_pytest_config(request):
    request.cls._dump_failed_filechecks = request.config.getoption("dump_failed_filechecks")


def pytest_sessionfinish(session):
    # Record which manager the run's contexts really used.
    try:
        from numba import cuda

        name = type(cuda.current_context().memory_manager).__name__
    except Exception as e:
        name = f"unknown ({type(e).__name__}: {e})"
    with open(os.environ["SUITE_MANAGER_FILE"], "w") as f:
        f.write(" ".join(name.split()) + "\n")
EOF

run() {  # run LABEL MANAGER
  local label=$1 manager=$2
  echo "== numba-cuda tests with NUMBA_CUDA_MEMORY_MANAGER=$manager"
  (cd "$WORK" && NUMBA_CUDA_MEMORY_MANAGER=$manager SUITE_MANAGER_FILE="$OUT/manager-$label.txt" \
     PYTHONPATH="$WORK:$PYTHONPATH" "$PY" -m pytest -p no:cacheprovider -p numba_bfc_suite_plugin -q -rfE --continue-on-collection-errors --pyargs "${TESTS[@]}" \
       --junitxml="$OUT/$label.xml" > "$OUT/$label.log" 2>&1) || true
  tail -n 3 "$OUT/$label.log"
}

run numba_bfc "$MODULE"
if [[ "${SKIP_BASELINE:-0}" != 1 ]]; then
  run default default
fi

"$PY" - "$OUT" <<'EOF'
import os, sys
import xml.etree.ElementTree as ET

out = sys.argv[1]

# Failures expected with any manager that sub-allocates (docs/gpu.md), by the
# end of the test's name: they do not count against numba_bfc.
ANY_POOL = {
    "TestIpcMemory::test_ipc_handle":
        "sends the IPC handle's raw bytes and size to the child but not its offset; a "
        "pooled block lies at an offset in its region (IpcHandle.open() applies it)",
}


def any_pool_reason(test):
    return next((why for end, why in ANY_POOL.items() if test.endswith(end)), None)


def results(label):
    path = os.path.join(out, f"{label}.xml")
    if not os.path.exists(path):
        return None
    res = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        res[name] = ("failed" if kinds & {"failure", "error"} else
                     "skipped" if "skipped" in kinds else "passed")
    return res


def counts(res):
    c = {"passed": 0, "failed": 0, "skipped": 0}
    for v in res.values():
        c[v] += 1
    return c


ours, base = results("numba_bfc"), results("default")
if ours is None:
    sys.exit("no results: see numba_bfc.log")
lines = ["# numba-cuda test modules with the numba_bfc memory manager", ""]
for label in ("numba_bfc", "default"):
    path = os.path.join(out, f"manager-{label}.txt")
    if os.path.exists(path):
        lines.append(f"- {label} run used `{open(path).read().strip()}`")
lines += ["", "| configuration | passed | failed | skipped |", "|---|---|---|---|"]
for label, res in (("numba_bfc", ours), ("default", base)):
    if res is not None:
        c = counts(res)
        lines.append(f"| {label} | {c['passed']} | {c['failed']} | {c['skipped']} |")
only_ours = sorted(t for t, v in ours.items()
                   if v == "failed" and (base is None or base.get(t) != "failed"))
both = sorted(t for t, v in ours.items() if v == "failed" and base and base.get(t) == "failed")
expected = [t for t in only_ours if any_pool_reason(t)]
only_ours = [t for t in only_ours if not any_pool_reason(t)]
lines += ["", f"## Failing only with numba_bfc ({len(only_ours)})", ""]
lines += [f"- `{t}`" for t in only_ours] or ["(none)"]
lines += ["", f"## Failing only with numba_bfc, as with any pool ({len(expected)})", ""]
lines += [f"- `{t}`: {any_pool_reason(t)}" for t in expected] or ["(none)"]
lines += ["", f"## Failing with both managers ({len(both)})", ""]
lines += [f"- `{t}`" for t in both] or ["(none)"]
with open(os.path.join(out, "summary.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines))
sys.exit(1 if only_ours else 0)
EOF
