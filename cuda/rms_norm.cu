// RMSNorm, and RMSNorm fused with the residual add in front of it; LayerNorm
// fused with the residual add (the vision encoder's norms).
//
//   rms_norm:              out = x / sqrt(mean(x^2) + eps) * w
//   fused_add_rms_norm:    residual = x + residual;  x = rms_norm(residual)   (both in place)
//   fused_add_layer_norm:  residual = x + residual;
//                          x = (residual - mean) / sqrt(var + eps) * w + b  (var biased; both in place)
//
// In the forward pass: rms_norm is layer 0's input norm; every later norm (the
// post-attention norm, the next layer's input norm, the final norm) adds the
// residual stream first, so it is fused_add_rms_norm. The SigLIP encoder
// (models/siglip.py) adds first too, the position embeddings at its first norm.
//
// A norm reads each row once and writes it once, so it runs at copy speed when
// every byte moves once, in 16-byte vectors, with many loads in flight:
// Grid: (min(T, resident blocks)): each block walks rows blockIdx.x,
// blockIdx.x + gridDim.x, ... and keeps its slice of the weight in registers
// across them, so w is read once per block, not once per row.
// Block: one thread per VEC-element chunk of a row (VEC = 16 bytes / sizeof(T),
// or 1 for rows that are not 16-byte aligned), up to 1024 threads; a thread
// holds N chunks, c = threadIdx.x + k * blockDim.x (k < N), so dim fits in
// N * VEC * blockDim.x (N <= 2 with vectors: 1024 threads leave 64 registers
// each). The row lives in registers between its read and its write.
#include "common.cuh"

using namespace rawpage;

namespace rows {
// This thread's chunk k starts at element chunk_start(k) (>= dim: no chunk).
template <int VEC>
__device__ __forceinline__ int chunk_start(int k) {
  return (threadIdx.x + k * blockDim.x) * VEC;
}

// This thread's chunks of a row of `v` into f (a norm's weight, or bias), as floats.
template <typename T, int VEC, int N>
__device__ __forceinline__ void load_chunks(const T* __restrict__ v, float (&f)[N][VEC], int dim) {
#pragma unroll
  for (int k = 0; k < N; ++k)
    if (chunk_start<VEC>(k) < dim) load_floats<T, VEC>(v + chunk_start<VEC>(k), f[k]);
}

// r = x_row + r_row, rounded to T (the residual stream is stored in T), written back to
// r_row and kept in r (this thread's chunks).
template <typename T, int VEC, int N>
__device__ __forceinline__ void add_residual(const T* __restrict__ x_row, T* __restrict__ r_row,
                                             float (&r)[N][VEC], int dim) {
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const int c = chunk_start<VEC>(k);
    if (c >= dim) continue;
    float h[VEC];
    load_floats<T, VEC>(x_row + c, h);
    load_floats<T, VEC>(r_row + c, r[k]);
#pragma unroll
    for (int i = 0; i < VEC; ++i) r[k][i] = to_float(from_float<T>(h[i] + r[k][i]));
    store_floats<T, VEC>(r_row + c, r[k]);
  }
}
}  // namespace rows

template <typename T, int VEC, int N>
__device__ void rms_norm(T* __restrict__ out,           // [T, dim]
                         const T* __restrict__ x,       // [T, dim]
                         const T* __restrict__ weight,  // [dim]
                         float eps, int dim, int num_tokens) {
  using rows::chunk_start;
  float w[N][VEC];
  rows::load_chunks<T, VEC, N>(weight, w, dim);

  for (int t = blockIdx.x; t < num_tokens; t += gridDim.x) {
    const T* x_row = x + i64(t) * dim;
    // ms = mean(x^2), accumulated in float over the row held in registers
    float v[N][VEC], sum_sq = 0.0f;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      if (chunk_start<VEC>(k) >= dim) continue;
      load_floats<T, VEC>(x_row + chunk_start<VEC>(k), v[k]);
#pragma unroll
      for (int i = 0; i < VEC; ++i) sum_sq += v[k][i] * v[k][i];
    }
    const float inv_rms = rsqrtf(block_sum(sum_sq) / float(dim) + eps);
    // out = (x / rms) * w
#pragma unroll
    for (int k = 0; k < N; ++k) {
      if (chunk_start<VEC>(k) >= dim) continue;
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[k][i] *= inv_rms * w[k][i];
      store_floats<T, VEC>(out + i64(t) * dim + chunk_start<VEC>(k), v[k]);
    }
  }
}

template <typename T, int VEC, int N>
__device__ void fused_add_rms_norm(T* __restrict__ x,         // [T, dim] in: h, out: normed
                                   T* __restrict__ residual,  // [T, dim] in: residual, out: h + residual
                                   const T* __restrict__ weight,  // [dim]
                                   float eps, int dim, int num_tokens) {
  using rows::chunk_start;
  float w[N][VEC];
  rows::load_chunks<T, VEC, N>(weight, w, dim);

  for (int t = blockIdx.x; t < num_tokens; t += gridDim.x) {
    T* x_row = x + i64(t) * dim;
    // r = x + residual, rounded to T (the residual stream is stored in T), and sum r^2
    float r[N][VEC], sum_sq = 0.0f;
    rows::add_residual<T, VEC, N>(x_row, residual + i64(t) * dim, r, dim);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      if (chunk_start<VEC>(k) >= dim) continue;
#pragma unroll
      for (int i = 0; i < VEC; ++i) sum_sq += r[k][i] * r[k][i];
    }
    const float inv_rms = rsqrtf(block_sum(sum_sq) / float(dim) + eps);
    // x = (r / rms) * w
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const int c = chunk_start<VEC>(k);
      if (c >= dim) continue;
#pragma unroll
      for (int i = 0; i < VEC; ++i) r[k][i] *= inv_rms * w[k][i];
      store_floats<T, VEC>(x_row + c, r[k]);
    }
  }
}

template <typename T, int VEC, int N>
__device__ void fused_add_layer_norm(T* __restrict__ x,         // [T, dim] in: h, out: normed
                                     T* __restrict__ residual,  // [T, dim] in: residual, out: h + residual
                                     const T* __restrict__ weight,  // [dim]
                                     const T* __restrict__ bias,    // [dim]
                                     float eps, int dim, int num_tokens) {
  using rows::chunk_start;
  float w[N][VEC], bias_f[N][VEC];
  rows::load_chunks<T, VEC, N>(weight, w, dim);
  rows::load_chunks<T, VEC, N>(bias, bias_f, dim);

  for (int t = blockIdx.x; t < num_tokens; t += gridDim.x) {
    T* x_row = x + i64(t) * dim;
    // r = x + residual, rounded to T (the residual stream is stored in T); mean = sum(r) / dim
    float r[N][VEC], sum = 0.0f;
    rows::add_residual<T, VEC, N>(x_row, residual + i64(t) * dim, r, dim);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      if (chunk_start<VEC>(k) >= dim) continue;
#pragma unroll
      for (int i = 0; i < VEC; ++i) sum += r[k][i];
    }
    const float mean = block_sum(sum) / float(dim);
    // var = mean((r - mean)^2), from the row still in registers (two passes: no cancellation)
    float sum_sq = 0.0f;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      if (chunk_start<VEC>(k) >= dim) continue;
#pragma unroll
      for (int i = 0; i < VEC; ++i) sum_sq += (r[k][i] - mean) * (r[k][i] - mean);
    }
    const float inv_std = rsqrtf(block_sum(sum_sq) / float(dim) + eps);
    // x = (r - mean) / std * w + b
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const int c = chunk_start<VEC>(k);
      if (c >= dim) continue;
#pragma unroll
      for (int i = 0; i < VEC; ++i) r[k][i] = (r[k][i] - mean) * inv_std * w[k][i] + bias_f[k][i];
      store_floats<T, VEC>(x_row + c, r[k]);
    }
  }
}

#define RMS_NORM_ENTRY(T, suffix, VEC, N)                                                      \
  extern "C" __global__ void __launch_bounds__(1024) rms_norm_##suffix##_v##VEC##_n##N(        \
      T* out, const T* x, const T* weight, float eps, int dim, int num_tokens) {               \
    rms_norm<T, VEC, N>(out, x, weight, eps, dim, num_tokens);                                 \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(1024)                                           \
      fused_add_rms_norm_##suffix##_v##VEC##_n##N(                                             \
      T* x, T* residual, const T* weight, float eps, int dim, int num_tokens) {                \
    fused_add_rms_norm<T, VEC, N>(x, residual, weight, eps, dim, num_tokens);                  \
  }

#define LAYER_NORM_ENTRY(T, suffix, VEC, N)                                                    \
  extern "C" __global__ void __launch_bounds__(1024)                                           \
      fused_add_layer_norm_##suffix##_v##VEC##_n##N(                                           \
      T* x, T* residual, const T* weight, const T* bias, float eps, int dim, int num_tokens) { \
    fused_add_layer_norm<T, VEC, N>(x, residual, weight, bias, eps, dim, num_tokens);          \
  }

// VEC: 16-byte vectors, or single elements for rows that are not 16-byte aligned.
// LayerNorm holds its bias in registers too: two 16-bit vectors a thread (N = 2) would
// spill under 1024 threads' 64 registers, so 16-bit rows take one (up to 8192 elements,
// past every vision tower's width); rawpage/ops/layer_ops.py norm_launch knows.
#define NORM_ENTRIES(T, suffix, VEC, LAYER_NORM_VEC_N2) \
  RMS_NORM_ENTRY(T, suffix, VEC, 1)                     \
  RMS_NORM_ENTRY(T, suffix, VEC, 2)                     \
  RMS_NORM_ENTRY(T, suffix, 1, 1)                       \
  RMS_NORM_ENTRY(T, suffix, 1, 2)                       \
  RMS_NORM_ENTRY(T, suffix, 1, 4)                       \
  RMS_NORM_ENTRY(T, suffix, 1, 8)                       \
  LAYER_NORM_ENTRY(T, suffix, VEC, 1)                   \
  LAYER_NORM_VEC_N2                                     \
  LAYER_NORM_ENTRY(T, suffix, 1, 1)                     \
  LAYER_NORM_ENTRY(T, suffix, 1, 2)                     \
  LAYER_NORM_ENTRY(T, suffix, 1, 4)                     \
  LAYER_NORM_ENTRY(T, suffix, 1, 8)

NORM_ENTRIES(float, f32, 4, LAYER_NORM_ENTRY(float, f32, 4, 2))
NORM_ENTRIES(__half, f16, 8, )
NORM_ENTRIES(__nv_bfloat16, bf16, 8, )
