// Activations, elementwise:
//   silu_and_mul       out = silu(g) * u,  silu(g) = g / (1 + e^-g),  for x = [g | u]   (SwiGLU)
//   gelu_tanh_and_mul  out = gelu(g) * u,  for x = [g | u]                             (GeGLU, Gemma)
//   gelu_tanh          out = gelu(x)                                      (the SigLIP encoder's MLP)
// with gelu's tanh approximation, gelu(g) = g/2 (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), and
//   gelu_erf           out = x Phi(x) = x/2 (1 + erf(x / sqrt(2)))        (Qwen2.5-VL's patch merger)
// the exact GELU (torch's nn.GELU()), by CUDA's erff (2 ulp).
//
// In the forward pass: the gated ones sit between the fused gate/up projection
// (T, 2I) and the down projection (T, I); gelu_tanh between a vision layer's
// fc1 (T, I) and fc2; gelu_erf between the merger's two Linear layers.
//
// Each output element reads one or two inputs and is written once: a copy-speed
// kernel when every byte moves once, in 16-byte vectors.
// Grid: flat over the T * I / VEC chunks of the output (VEC = 16 bytes of T, or
// 1 when I or the arrays are not 16-byte aligned), at most the GPU's resident
// blocks, each thread striding by the whole grid. Block: 256 threads.
#include "common.cuh"

using namespace rawpage;

struct Silu {
  __device__ static float apply(float g) { return g / (1.0f + expf(-g)); }
};

struct GeluTanh {
  __device__ static float apply(float g) {
    const float inner = 0.7978845608028654f * (g + 0.044715f * g * g * g);  // sqrt(2/pi) (g + 0.044715 g^3)
    return 0.5f * g * (1.0f + tanhf(inner));
  }
};

struct GeluErf {
  __device__ static float apply(float g) { return 0.5f * g * (1.0f + erff(g * 0.7071067811865476f)); }  // g / sqrt(2)
};

// GATED: x is [gate | up] (T, 2I) and out = act(gate) * up; else x is (T, I) and out = act(x).
template <typename Act, bool GATED, typename T, int VEC>
__device__ void activation(T* __restrict__ out,      // [T, I]
                           const T* __restrict__ x,  // [T, 2I] ([gate | up]) or [T, I]
                           int d, int num_tokens) {  // I
  const int chunks = d / VEC;  // per row
  const i64 total = i64(num_tokens) * chunks;
  const int x_row = GATED ? 2 * d : d;
  for (i64 c = i64(blockIdx.x) * blockDim.x + threadIdx.x; c < total; c += i64(gridDim.x) * blockDim.x) {
    const i64 t = c / chunks;
    const int i = int(c % chunks) * VEC;
    float g[VEC];
    load_floats<T, VEC>(x + t * x_row + i, g);
#pragma unroll
    for (int e = 0; e < VEC; ++e) g[e] = Act::apply(g[e]);
    if constexpr (GATED) {
      float u[VEC];
      load_floats<T, VEC>(x + t * x_row + d + i, u);
#pragma unroll
      for (int e = 0; e < VEC; ++e) g[e] *= u[e];
    }
    store_floats<T, VEC>(out + t * d + i, g);
  }
}

// Entry points <name>_<dtype>_v<VEC>: VEC 16-byte vectors or single elements.
#define ACTIVATION_ENTRY(name, Act, GATED, T, suffix, VEC)                                   \
  extern "C" __global__ void name##_##suffix##_v##VEC(T* out, const T* x, int d, int num_tokens) { \
    activation<Act, GATED, T, VEC>(out, x, d, num_tokens);                                   \
  }

#define ACTIVATION_ENTRIES(name, Act, GATED)                       \
  ACTIVATION_ENTRY(name, Act, GATED, float, f32, 4)                \
  ACTIVATION_ENTRY(name, Act, GATED, float, f32, 1)                \
  ACTIVATION_ENTRY(name, Act, GATED, __half, f16, 8)               \
  ACTIVATION_ENTRY(name, Act, GATED, __half, f16, 1)               \
  ACTIVATION_ENTRY(name, Act, GATED, __nv_bfloat16, bf16, 8)       \
  ACTIVATION_ENTRY(name, Act, GATED, __nv_bfloat16, bf16, 1)

ACTIVATION_ENTRIES(silu_and_mul, Silu, true)
ACTIVATION_ENTRIES(gelu_tanh_and_mul, GeluTanh, true)
ACTIVATION_ENTRIES(gelu_tanh, GeluTanh, false)
ACTIVATION_ENTRIES(gelu_erf, GeluErf, false)
