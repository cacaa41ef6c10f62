#!/usr/bin/env bash
# The device check: aelastic's CUDA paths on one GPU, in one command (under 8 minutes).
#
#   bash benchmarks/device_check.sh                      # a GPU machine
#   DEVICE_CHECK_CPU=1 bash benchmarks/device_check.sh   # the plumbing, CPU and gloo
#
# Installs nothing: aelastic runs from this working tree (PYTHONPATH). The device
# machine has Python, torch, anyio and h11 but maybe not sniffio (anyio >= 4.10 no
# longer brings it): then the pure-Python wheel in benchmarks/_device/wheels is put on
# PYTHONPATH (Python imports pure packages from a wheel, which is a zip). Writes
# device_check.json and device_check.md to $OUT (the device tool's output folder) when
# set; prints the table either way. What each check measures: benchmarks/_device/check.py.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# $PYTHON, else the first of python3 and python that imports torch.
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    for candidate in python3 python; do
        if command -v "$candidate" >/dev/null && "$candidate" -c "import torch" 2>/dev/null; then
            PY=$(command -v "$candidate")
            break
        fi
    done
fi
if [ -z "$PY" ]; then
    echo "device_check: no python3 or python here imports torch; set PYTHON=/path/to/python" >&2
    exit 2
fi
# Found, not imported: importing torch here would cost seconds that check.py spends again.
missing=$("$PY" -c 'import importlib.util as u
print(" ".join(m for m in ("torch", "anyio", "h11") if u.find_spec(m) is None))' 2>/dev/null ||
    echo "torch anyio h11")
for module in $missing; do
    echo "device_check: $PY cannot import $module; this check needs torch, anyio and h11" >&2
    exit 2
done
if ! "$PY" -c "import sniffio" 2>/dev/null; then
    wheel=$(ls benchmarks/_device/wheels/sniffio-*.whl 2>/dev/null | head -n 1 || true)
    if [ -z "$wheel" ]; then
        echo "device_check: sniffio is not importable and benchmarks/_device/wheels has no" \
             "sniffio wheel; put one there (pip download sniffio --no-deps -d" \
             "benchmarks/_device/wheels) before running this on the device machine" >&2
        exit 2
    fi
    export PYTHONPATH="$PYTHONPATH:$PWD/$wheel"
fi
"$PY" -c "import aelastic.launcher, sniffio" || {
    echo "device_check: aelastic does not import from $PWD (above)" >&2
    exit 2
}
if [ -z "${DEVICE_CHECK_CPU:-}" ] && ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    echo "device_check: torch sees no GPU here; DEVICE_CHECK_CPU=1 runs the CPU dry run" >&2
    exit 2
fi
exec "$PY" benchmarks/_device/check.py ${OUT:+--out "$OUT"} "$@"
