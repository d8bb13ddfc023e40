// Linear layers on FP8 e4m3 weights with a scale per output row (per-channel, or
// one per-tensor scale repeated):  y[t, n] = s[n] sum_k e4m3(W[n, k]) x[t, k] (+ bias).
//
// Decode (a few tokens) always reads the e4m3 bytes directly:
//   fp8_gemv:       one warp per output row, for all T <= 8 tokens (each weight byte
//                   read once per step); a lane takes 16 weights (one 16-byte load)
//                   at a time. Grid: ceil(N / warps). Block: warps x 32.
// Prefill on sm_80 (no FP8 tensor cores) dequantizes and calls the dense GEMM:
//   fp8_dequantize: W -> dense (N, K) scratch. Grid: (N).
// Prefill on sm_89 / sm_90 multiplies in FP8 on cuBLASLt (rawpage/backends/cublaslt_fp8.py),
// with these two around it:
//   fp8_quantize_rows: x (T, K) -> e4m3 xq (T, K) and a scale per token,
//                   sx[t] = max_k |x[t, k]| / 448, xq = e4m3(x / sx).
//                   Grid: (T). Block: 256 threads strided over the row; block max.
//   fp8_scale_output: y[t, n] = D[t, n] sx[t] s[n] (+ bias[n]), D = xq e4m3(W)^T the
//                   float32 product cuBLASLt wrote. Grid: flat over T N. Block: 256.
#include "common.cuh"
#include "fp8.cuh"
#include "gemv.cuh"  // kMaxTokens

using namespace rawpage;


template <typename T>
__device__ void fp8_gemv(T* __restrict__ out,                 // [T, N]
                         const T* __restrict__ x,             // [T, K], rows 16-byte aligned
                         const unsigned char* __restrict__ w, // [N, K] e4m3 bits, K % 16 == 0
                         const float* __restrict__ scales,    // [N]
                         const T* __restrict__ bias,          // [N], read only if has_bias
                         int has_bias, int num_tokens, int N, int K) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n = blockIdx.x * (blockDim.x / 32) + warp;  // this warp's output row
  if (n >= N) return;                                   // whole warps leave; no barrier follows
  const uint4* row = reinterpret_cast<const uint4*>(w + i64(n) * K);

  float acc[kMaxTokens] = {};  // per token: sum over this lane's 16-value chunks of e4m3(W) . x
  for (int c = lane; c < K / 16; c += 32) {
    const uint4 v = row[c];
    const unsigned char* b = reinterpret_cast<const unsigned char*>(&v);
    float wc[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) wc[i] = e4m3_to_float(b[i]);
#pragma unroll
    for (int t = 0; t < kMaxTokens; ++t) {
      if (t >= num_tokens) break;
      float xc[16];
      load_floats<T, 16>(x + i64(t) * K + 16 * c, xc);
#pragma unroll
      for (int i = 0; i < 16; ++i) acc[t] += wc[i] * xc[i];
    }
  }
#pragma unroll
  for (int t = 0; t < kMaxTokens; ++t) {
    if (t >= num_tokens) break;
    const float y = warp_sum(acc[t]) * scales[n];
    if (lane == 0) out[i64(t) * N + n] = from_float<T>(y + (has_bias ? to_float(bias[n]) : 0.0f));
  }
}

template <typename T>
__device__ void fp8_dequantize(T* __restrict__ out,                 // [N, K]
                               const unsigned char* __restrict__ w, // [N, K] e4m3 bits
                               const float* __restrict__ scales,    // [N]
                               int K) {
  const int n = blockIdx.x;
  const float s = scales[n];
  for (int k = threadIdx.x; k < K; k += blockDim.x) out[i64(n) * K + k] = from_float<T>(s * e4m3_to_float(w[i64(n) * K + k]));
}

template <typename T>
__device__ void fp8_quantize_rows(unsigned char* __restrict__ xq,  // [T, K] e4m3 bits
                                  float* __restrict__ sx,          // [T]
                                  const T* __restrict__ x,         // [T, K]
                                  int K) {
  __shared__ float warp_max[32];
  const int t = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const T* row = x + i64(t) * K;
  // amax = max_k |x[t, k]|: each thread over its strided elements, then the warp, then the block
  float amax = 0.0f;
  for (int k = threadIdx.x; k < K; k += blockDim.x) amax = fmaxf(amax, fabsf(to_float(row[k])));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (lane == 0) warp_max[warp] = amax;
  __syncthreads();  // every warp's max is in warp_max
  amax = 0.0f;
  for (int w = 0; w < int(blockDim.x / 32); ++w) amax = fmaxf(amax, warp_max[w]);
  const float s = amax / 448.0f;
  const float inv = s > 0.0f ? 1.0f / s : 0.0f;
  for (int k = threadIdx.x; k < K; k += blockDim.x) xq[i64(t) * K + k] = float_to_e4m3(to_float(row[k]) * inv);
  if (threadIdx.x == 0) sx[t] = s;
}

template <typename T>
__device__ void fp8_scale_output(T* __restrict__ out,             // [T, N]
                                 const float* __restrict__ d,     // [T, N], xq e4m3(W)^T from cuBLASLt
                                 const float* __restrict__ sx,    // [T]
                                 const float* __restrict__ sw,    // [N]
                                 const T* __restrict__ bias,      // [N], read only if has_bias
                                 int has_bias, int num_tokens, int N) {
  const i64 total = i64(num_tokens) * N;
  for (i64 i = i64(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += i64(gridDim.x) * blockDim.x) {
    const int t = int(i / N), n = int(i % N);
    out[i] = from_float<T>(d[i] * sx[t] * sw[n] + (has_bias ? to_float(bias[n]) : 0.0f));
  }
}

#define FP8_ENTRIES(T, suffix)                                                                             \
  extern "C" __global__ void fp8_gemv_##suffix(T* out, const T* x, const unsigned char* w,                 \
                                               const float* scales, const T* bias, int has_bias,           \
                                               int num_tokens, int N, int K) {                             \
    fp8_gemv<T>(out, x, w, scales, bias, has_bias, num_tokens, N, K);                                      \
  }                                                                                                        \
  extern "C" __global__ void fp8_dequantize_##suffix(T* out, const unsigned char* w, const float* scales,  \
                                                     int K) {                                              \
    fp8_dequantize<T>(out, w, scales, K);                                                                  \
  }                                                                                                        \
  extern "C" __global__ void fp8_quantize_rows_##suffix(unsigned char* xq, float* sx, const T* x, int K) { \
    fp8_quantize_rows<T>(xq, sx, x, K);                                                                    \
  }                                                                                                        \
  extern "C" __global__ void fp8_scale_output_##suffix(T* out, const float* d, const float* sx,            \
                                                       const float* sw, const T* bias, int has_bias,       \
                                                       int num_tokens, int N) {                            \
    fp8_scale_output<T>(out, d, sx, sw, bias, has_bias, num_tokens, N);                                    \
  }

FP8_ENTRIES(float, f32)
FP8_ENTRIES(__half, f16)
FP8_ENTRIES(__nv_bfloat16, bf16)
