#!/usr/bin/env bash
# Fill .gpu-wheels/ with the wheels tools/gpu_check.sh may need on a GPU image
# that has torch, CuPy, numpy, tokenizers and safetensors but not pytest,
# transformers or Pillow. Run it here, where PyPI is reachable, before the device call,
# and pass the folder along:  run(command="bash tools/gpu_check.sh", carry=[".gpu-wheels"])
#
# The device machine cannot reach PyPI, and we do not know its Python version,
# so binary wheels come for CPython 3.10 to 3.13. tools/gpu_check/deps.py
# unpacks, on the device, only what that interpreter cannot already import.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.gpu-wheels
TRANSFORMERS=${TRANSFORMERS:-transformers==5.24.0}
PY=${PYTHON:-python3}
mkdir -p "$DEST"

# Pure-Python wheels (and the dependency closure pip picks for them), one copy.
$PY -m pip download -q -d "$DEST/tmp" "$TRANSFORMERS" pytest pillow  # pillow: the vision step's images
# The GPU image brings its own of these; they are large and must not be shadowed.
rm -f "$DEST"/tmp/{numpy,torch,nvidia,triton,sympy,networkx,mpmath,setuptools}[-_]*.whl
mv "$DEST"/tmp/*-none-any.whl "$DEST"/ 2>/dev/null || true
# Binary wheels: the ones pip just picked, by name, for every CPython we might meet.
binaries=$(ls "$DEST"/tmp/*.whl 2>/dev/null | xargs -rn1 basename | cut -d- -f1 | sort -u)
rm -rf "$DEST/tmp"
for v in 3.10 3.11 3.12 3.13; do
  for name in $binaries; do
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version "$v" \
      --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$DEST" "$name" || \
      echo "no $name wheel for Python $v (skipped)"
  done
done
du -sh "$DEST"
ls "$DEST" | sed 's/^/  /'
