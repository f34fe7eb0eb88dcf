#!/usr/bin/env bash
# One GPU check: environment, the cuda-marked tests, and the quick GPU benchmark, logs and JSON in $OUT.
#
#   bash benchmarks/gpu_check.sh                 # from the repository root on a CUDA machine
#   OUT=/tmp/gpu_out DEADLINE_S=450 bash benchmarks/gpu_check.sh
#   BENCH_ARGS=--dry-run bash benchmarks/gpu_check.sh   # the benchmark step on CPU (checks the script)
#
# Needs python3 with torch (CUDA), triton, numpy and numba; installs nothing from the network. Wheels
# or sdists found in .whl/ (git-ignored; e.g. diffsort-*.whl, torchsort-*.tar.gz) are installed
# offline into /tmp/site first: torchsort's CUDA extension is built from its sdist with nvcc, in the
# background while the tests run (its column in the benchmark is skipped when that fails). Every
# step runs even when an earlier one failed; the steps share DEADLINE_S seconds (default 450), and
# $OUT/summary.txt says what ran, what failed and what was skipped.
set -u
cd "$(dirname "$0")/.." || exit 1
OUT="${OUT:-benchmarks/results/gpu_check}"
mkdir -p "$OUT"
DEADLINE_S="${DEADLINE_S:-450}"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 RANKWISE_NUMBA=sync
export PYTHONPATH="$PWD/src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((DEADLINE_S - SECONDS)); }

# ---------------------------------------------------------------- (a) environment
{
    echo "date: $(date -u +%FT%TZ)"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo 'not a git checkout')"
    nvidia-smi 2>&1 || echo "nvidia-smi failed"
    "$PY" - <<'EOF' 2>&1
import importlib, sys
print("python", sys.version.split()[0], sys.executable)
for name in ("torch", "triton", "numpy", "numba", "pytest", "lightning", "hypothesis", "scipy", "torchsort", "diffsort"):
    try:
        mod = importlib.import_module(name)
        print(f"{name:10s} {getattr(mod, '__version__', 'installed')}")
    except Exception as exc:
        print(f"{name:10s} MISSING ({type(exc).__name__}: {exc})")
import torch
print("cuda available:", torch.cuda.is_available(), "| torch.version.cuda:", torch.version.cuda)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device:", p.name, f"{p.total_memory / 2**30:.1f} GiB", f"sm_{p.major}{p.minor}", p.multi_processor_count, "SMs")
EOF
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
for need in torch triton numpy numba pytest; do
    if grep -q "^$need .*MISSING" "$OUT/env.txt"; then note "MISSING: $need (steps that need it will fail or skip)"; fi
done

# ---------------------------------------------------------------- offline installs from .whl/
BUILD_PID=""
if [ -d .whl ]; then
    mkdir -p /tmp/site
    if ls .whl/*.whl >/dev/null 2>&1; then
        if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
            >"$OUT/install.log" 2>&1; then
            note "installed wheels: $(cd .whl && ls ./*.whl | tr '\n' ' ')"
        else
            note "FAILED: installing .whl/*.whl (see install.log)"
        fi
    fi
    if ls .whl/torchsort-*.tar.gz >/dev/null 2>&1; then
        (
            export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" MAX_JOBS="${MAX_JOBS:-12}"
            timeout 300 "$PY" -m pip install --no-index --no-deps --no-build-isolation --no-cache-dir \
                --target /tmp/site .whl/torchsort-*.tar.gz
        ) >>"$OUT/install.log" 2>&1 &
        BUILD_PID=$!
        note "building torchsort from its sdist in the background (pid $BUILD_PID)"
    fi
else
    note "no .whl/ folder: torchsort and diffsort columns are skipped unless already installed"
fi

# ---------------------------------------------------------------- (b) cuda-marked tests
PYTEST_S=$(($(left) - 200))
[ "$PYTEST_S" -gt 240 ] && PYTEST_S=240
if [ "$PYTEST_S" -lt 30 ]; then
    note "SKIPPED: tests (only $(left) s left)"
else
    # -v: one line per test in the log, so a run stopped at its limit still says what passed;
    # 4 workers (pytest-xdist) when available: the numba and Triton JIT caches on disk are shared
    OPTS=""
    "$PY" -c "import pytest_timeout" 2>/dev/null && OPTS="--timeout=120"
    "$PY" -c "import xdist" 2>/dev/null && OPTS="$OPTS -n 4"
    # shellcheck disable=SC2086
    timeout "$PYTEST_S" "$PY" -m pytest -v -p no:cacheprovider -rfEsx $OPTS \
        --junitxml="$OUT/pytest_cuda.xml" \
        -m cuda tests/test_cuda.py tests/ops/test_isotonic_triton.py tests/ops/test_isotonic.py \
        >"$OUT/pytest_cuda.log" 2>&1
    rc=$?
    tail -n 40 "$OUT/pytest_cuda.log"
    note "tests (-m cuda): rc=$rc ($(tail -n 1 "$OUT/pytest_cuda.log"))"
    [ "$rc" = 124 ] && note "tests stopped at the ${PYTEST_S} s limit"
    # CUDA tests elsewhere in tests/ops carry only a skipif (no marker): run them by name
    if [ "$(left)" -gt 170 ]; then
        timeout 60 "$PY" -m pytest -q -p no:cacheprovider -rfEsx -k cuda \
            tests/ops/test_permutation.py tests/ops/test_sinkhorn.py >>"$OUT/pytest_cuda.log" 2>&1
        note "tests (-k cuda, permutation/sinkhorn): rc=$? ($(tail -n 1 "$OUT/pytest_cuda.log"))"
    fi
fi

# ---------------------------------------------------------------- (c) quick GPU benchmark
if [ -n "$BUILD_PID" ]; then
    wait "$BUILD_PID"
    rc=$?
    if [ "$rc" = 0 ] && "$PY" -c "import torch, torchsort; torchsort.soft_rank(torch.randn(2, 5, device='cuda'))" \
        >>"$OUT/install.log" 2>&1; then
        note "torchsort built and runs on CUDA"
    else
        note "FAILED: torchsort build or CUDA call (rc=$rc; see install.log): its column is skipped"
    fi
fi
BENCH_S=$(($(left) - 15))
if [ "$BENCH_S" -lt 60 ]; then
    note "SKIPPED: benchmark (only $(left) s left)"
else
    BUDGET=$((BENCH_S - 60))
    [ "$BUDGET" -gt 200 ] && BUDGET=200
    [ "$BUDGET" -lt 30 ] && BUDGET=30
    # shellcheck disable=SC2086  # BENCH_ARGS: several options (default --quick; --dry-run checks the script on CPU)
    timeout "$BENCH_S" "$PY" benchmarks/gpu.py ${BENCH_ARGS:---quick} --budget-s "$BUDGET" --out "$OUT/gpu.json" \
        >"$OUT/gpu.log" 2>&1
    rc=$?
    grep -v "^W[0-9]\|^ \|UserWarning\|warn_once\|^This call\|^$" "$OUT/gpu.log" | tail -n 40
    note "benchmark: rc=$rc (budget ${BUDGET} s, limit ${BENCH_S} s); JSON: $OUT/gpu.json"
fi
note "total: ${SECONDS} s"
cat "$SUMMARY"
