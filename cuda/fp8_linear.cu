// Linear layers on FP8 e4m3 weights with a scale per output row (per-channel, or
// one per-tensor scale repeated):  y[t, n] = s[n] sum_k e4m3(W[n, k]) x[t, k] (+ bias).
//
// Where cuBLASLt's FP8 GEMM is not used (sm_80, the simulator, and until its path is
// measured), this is the dequantization path, with the same two kernels as the
// GGUF and int4 files:
//   fp8_gemv:       decode. One warp per output row; a lane takes 16 weights (one
//                   16-byte load) at a time. Grid: (ceil(N / warps), T). Block: warps x 32.
//   fp8_dequantize: prefill. W -> dense (N, K) scratch for the GEMM. Grid: (N).
#include "common.cuh"
#include "fp8.cuh"

using namespace rawpage;

template <typename T>
__device__ void fp8_gemv(T* __restrict__ out,                 // [T, N]
                         const T* __restrict__ x,             // [T, K], rows 16-byte aligned
                         const unsigned char* __restrict__ w, // [N, K] e4m3 bits, K % 16 == 0
                         const float* __restrict__ scales,    // [N]
                         const T* __restrict__ bias,          // [N], read only if has_bias
                         int has_bias, int N, int K) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n = blockIdx.x * (blockDim.x / 32) + warp;  // this warp's output row
  if (n >= N) return;                                   // whole warps leave; no barrier follows
  const int t = blockIdx.y;
  const uint4* row = reinterpret_cast<const uint4*>(w + i64(n) * K);
  const T* xt = x + i64(t) * K;

  float acc = 0.0f;  // sum over this lane's 16-value chunks of e4m3(W) . x
  for (int c = lane; c < K / 16; c += 32) {
    const uint4 v = row[c];
    const unsigned char* b = reinterpret_cast<const unsigned char*>(&v);
    float xc[16];
    load_floats<T, 16>(xt + 16 * c, xc);
#pragma unroll
    for (int i = 0; i < 16; ++i) acc += e4m3_to_float(b[i]) * xc[i];
  }
  acc = warp_sum(acc) * scales[n];
  if (lane == 0) out[i64(t) * N + n] = from_float<T>(acc + (has_bias ? to_float(bias[n]) : 0.0f));
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

#define FP8_ENTRIES(T, suffix)                                                                             \
  extern "C" __global__ void fp8_gemv_##suffix(T* out, const T* x, const unsigned char* w,                 \
                                               const float* scales, const T* bias, int has_bias, int N,    \
                                               int K) {                                                    \
    fp8_gemv<T>(out, x, w, scales, bias, has_bias, N, K);                                                  \
  }                                                                                                        \
  extern "C" __global__ void fp8_dequantize_##suffix(T* out, const unsigned char* w, const float* scales,  \
                                                     int K) {                                              \
    fp8_dequantize<T>(out, w, scales, K);                                                                  \
  }

FP8_ENTRIES(float, f32)
FP8_ENTRIES(__half, f16)
FP8_ENTRIES(__nv_bfloat16, bf16)
