// RMSNorm, and RMSNorm fused with the residual add in front of it.
//
//   rms_norm:            out = x / sqrt(mean(x^2) + eps) * w
//   fused_add_rms_norm:  residual = x + residual;  x = rms_norm(residual)   (both in place)
//
// In the forward pass: rms_norm is layer 0's input norm; every later norm (the
// post-attention norm, the next layer's input norm, the final norm) adds the
// residual stream first, so it is fused_add_rms_norm.
//
// Grid: one block per token row. Block: threads stride over the row, twice:
// once for the sum of squares (reduced across the block), once to write.
#include "common.cuh"

using namespace rawpage;

template <typename T>
__device__ void rms_norm(T* __restrict__ out,           // [T, dim]
                         const T* __restrict__ x,       // [T, dim]
                         const T* __restrict__ weight,  // [dim]
                         float eps, int dim) {
  const i64 row = i64(blockIdx.x) * dim;
  // ms = mean(x^2), accumulated in float
  float sum_sq = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = to_float(x[row + i]);
    sum_sq += v * v;
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq) / float(dim) + eps);
  // out = (x / rms) * w
  for (int i = threadIdx.x; i < dim; i += blockDim.x)
    out[row + i] = from_float<T>(to_float(x[row + i]) * inv_rms * to_float(weight[i]));
}

template <typename T>
__device__ void fused_add_rms_norm(T* __restrict__ x,         // [T, dim] in: h, out: normed
                                   T* __restrict__ residual,  // [T, dim] in: residual, out: h + residual
                                   const T* __restrict__ weight,  // [dim]
                                   float eps, int dim) {
  const i64 row = i64(blockIdx.x) * dim;
  // r = x + residual, rounded to T (the residual stream is stored in T), and sum r^2
  float sum_sq = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const T r = from_float<T>(to_float(x[row + i]) + to_float(residual[row + i]));
    residual[row + i] = r;
    const float v = to_float(r);
    sum_sq += v * v;
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq) / float(dim) + eps);
  // x = (r / rms) * w; each thread rereads only the residual elements it wrote
  for (int i = threadIdx.x; i < dim; i += blockDim.x)
    x[row + i] = from_float<T>(to_float(residual[row + i]) * inv_rms * to_float(weight[i]));
}

#define RMS_NORM_ENTRIES(T, suffix)                                                           \
  extern "C" __global__ void rms_norm_##suffix(T* out, const T* x, const T* weight, float eps, \
                                               int dim) {                                      \
    rms_norm<T>(out, x, weight, eps, dim);                                                     \
  }                                                                                            \
  extern "C" __global__ void fused_add_rms_norm_##suffix(T* x, T* residual, const T* weight,   \
                                                         float eps, int dim) {                 \
    fused_add_rms_norm<T>(x, residual, weight, eps, dim);                                      \
  }

RMS_NORM_ENTRIES(float, f32)
RMS_NORM_ENTRIES(__half, f16)
RMS_NORM_ENTRIES(__nv_bfloat16, bf16)
