#!/usr/bin/env bash
# Build a throw-away venv with NVIDIA's nvidia-resiliency-ext 0.7.0 (ft_launcher), for the
# side-by-side hang-detection benchmark only. Never a dependency of aelastic; nothing of NVRx
# is committed here.
#
#   bash benchmarks/nvrx_setup.sh [VENV]      (default: $NVRX_VENV or /work/nvrx-venv)
#
# Prints the venv's ft_launcher path on its last line. Idempotent: an existing venv whose
# ft_launcher imports is reused.
#
# Why the retagging: 0.7.0 is published on PyPI only as a cp312 / manylinux_2_39 wheel.
# Its Python code runs on 3.10+ (Requires-Python >=3.10) and on older glibc; the only
# native part, nvrx_cupti_module.cpython-312-x86_64-linux-gnu.so, serves straggler
# detection (CUPTI, GPU only) and is dropped. The wheel is unpacked, that module removed,
# its tag rewritten to py3-none-any, repacked, and installed with --no-deps; its declared
# runtime dependencies are then installed by hand (torch is the machine's CPU 2.13.0, never
# another one: the interpreter must be the one the local torch wheel was built for).
set -euo pipefail

VENV="${1:-${NVRX_VENV:-/work/nvrx-venv}}"
PYTHON="${NVRX_PYTHON:-python3.11}"
VERSION="0.7.0"
TORCH="torch==2.13.0"
# Requires-Dist of nvidia-resiliency-ext 0.7.0 without extras, torch aside.
DEPS=(defusedxml "fastapi>=0.100.0" "grpcio>=1.76.0,<2" "grpcio-tools>=1.76.0,<2" "httpx>=0.24.0"
    "numpy>=1.26" "nvidia-ml-py>=12.570.86" packaging "protobuf>=4.22.0" "psutil>=6.0.0"
    "pydantic>=2.0.0" "pydantic-settings>=2.0.0" pyyaml "slowapi>=0.1.9" "uvicorn[standard]>=0.20.0")

if [[ -x "$VENV/bin/ft_launcher" ]] \
    && "$VENV/bin/python" -c "import nvidia_resiliency_ext.fault_tolerance.launcher" 2>/dev/null; then
    echo "$VENV/bin/ft_launcher"
    exit 0
fi

"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q)
"${PIP[@]}" "$TORCH" wheel

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
"$VENV/bin/python" -m pip download -q "nvidia-resiliency-ext==$VERSION" --no-deps \
    --only-binary=:all: --python-version 3.12 --platform manylinux_2_39_x86_64 -d "$WORK/dl"
"$VENV/bin/python" -m wheel unpack -d "$WORK/src" "$WORK"/dl/nvidia_resiliency_ext-*.whl >/dev/null
TREE="$WORK/src/nvidia_resiliency_ext-$VERSION"
rm -f "$TREE"/nvrx_cupti_module.*.so
META="$TREE/nvidia_resiliency_ext-$VERSION.dist-info/WHEEL"
sed -i -e '/^Tag: /d' -e 's/^Root-Is-Purelib: .*/Root-Is-Purelib: true/' "$META"
echo "Tag: py3-none-any" >>"$META"
mkdir -p "$WORK/repacked"
"$VENV/bin/python" -m wheel pack -d "$WORK/repacked" "$TREE" >/dev/null
"${PIP[@]}" --no-deps "$WORK"/repacked/nvidia_resiliency_ext-"$VERSION"-py3-none-any.whl
"${PIP[@]}" "$TORCH" "${DEPS[@]}"

"$VENV/bin/python" -c "import nvidia_resiliency_ext.fault_tolerance.launcher" >/dev/null
echo "$VENV/bin/ft_launcher"
