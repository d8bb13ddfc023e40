// SwiGLU's gate:  out = silu(g) * u,  silu(g) = g / (1 + e^-g),  for x = [g | u].
//
// In the forward pass: between the fused gate/up projection (T, 2I) and the
// down projection (T, I).
//
// Each output element reads two inputs and is written once: a copy-speed
// kernel when every byte moves once, in 16-byte vectors.
// Grid: flat over the T * I / VEC chunks of the output (VEC = 16 bytes of T, or
// 1 when I or the arrays are not 16-byte aligned), at most the GPU's resident
// blocks, each thread striding by the whole grid. Block: 256 threads.
#include "common.cuh"

using namespace rawpage;

template <typename T, int VEC>
__device__ void silu_and_mul(T* __restrict__ out,      // [T, I]
                             const T* __restrict__ x,  // [T, 2I]: [gate | up]
                             int d, int num_tokens) {  // I
  const int chunks = d / VEC;  // per row
  const i64 total = i64(num_tokens) * chunks;
  for (i64 c = i64(blockIdx.x) * blockDim.x + threadIdx.x; c < total; c += i64(gridDim.x) * blockDim.x) {
    const i64 t = c / chunks;
    const int i = int(c % chunks) * VEC;
    float g[VEC], u[VEC];
    load_floats<T, VEC>(x + t * 2 * d + i, g);
    load_floats<T, VEC>(x + t * 2 * d + d + i, u);
#pragma unroll
    for (int e = 0; e < VEC; ++e) g[e] = g[e] / (1.0f + expf(-g[e])) * u[e];
    store_floats<T, VEC>(out + t * d + i, g);
  }
}

#define SILU_ENTRY(T, suffix, VEC)                                                            \
  extern "C" __global__ void silu_and_mul_##suffix##_v##VEC(T* out, const T* x, int d,        \
                                                            int num_tokens) {                 \
    silu_and_mul<T, VEC>(out, x, d, num_tokens);                                              \
  }

SILU_ENTRY(float, f32, 4)
SILU_ENTRY(float, f32, 1)
SILU_ENTRY(__half, f16, 8)
SILU_ENTRY(__half, f16, 1)
SILU_ENTRY(__nv_bfloat16, bf16, 8)
SILU_ENTRY(__nv_bfloat16, bf16, 1)
