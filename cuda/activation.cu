// SwiGLU's gate:  out = silu(g) * u,  silu(g) = g / (1 + e^-g),  for x = [g | u].
//
// In the forward pass: between the fused gate/up projection (T, 2I) and the
// down projection (T, I).
//
// Grid: one block per token. Block: threads stride over the I outputs.
#include "common.cuh"

using namespace rawpage;

template <typename T>
__device__ void silu_and_mul(T* __restrict__ out,      // [T, I]
                             const T* __restrict__ x,  // [T, 2I]: [gate | up]
                             int d) {                  // I
  const T* g = x + i64(blockIdx.x) * 2 * d;
  const T* u = g + d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const float gi = to_float(g[i]);
    out[i64(blockIdx.x) * d + i] = from_float<T>(gi / (1.0f + expf(-gi)) * to_float(u[i]));
  }
}

#define SILU_ENTRY(T, suffix)                                                       \
  extern "C" __global__ void silu_and_mul_##suffix(T* out, const T* x, int d) {   \
    silu_and_mul<T>(out, x, d);                                                     \
  }

SILU_ENTRY(float, f32)
SILU_ENTRY(__half, f16)
SILU_ENTRY(__nv_bfloat16, bf16)
