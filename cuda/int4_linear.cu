// Linear layers on 4-bit weights (AWQ and GPTQ, converted at load to one layout):
//   y = x W^T (+ bias),   W[n, c] = s[n, g] (q[n, c] - z[n, g]),   g = c / G
//
// The layout (rawpage/quantization/int4.py), one weight row n:
//
//   w      [ word 0          | word 1          | ... ]   K/8 uint32 words
//            nibble i of word j = q[n, 8j + i], low nibble first
//   scales [ s_0 | s_1 | ... ]   K/G float16        zeros [ z_0 | z_1 | ... ]  float16
//
// A chunk is 32 values = 4 words = one 16-byte load; G is a multiple of 32, so a
// chunk never straddles groups and each chunk needs one (s, z):
//   sum_c  s (q_c - z) x_c  =  s (sum q_c x_c - z sum x_c)
//
// With GPTQ act-order the columns were stored sorted by group, and the caller
// passes x with its columns permuted the same way.
//
// Two kernels, as for GGUF (gguf_linear.cu):
//   int4_gemv:       decode (T <= 8). One warp per output row, computing it for all
//                    T tokens, so each weight word is read and unpacked once per step
//                    (an 8B layer's weights do not fit in L2: a grid row per token
//                    would read them from HBM T times). Lanes take chunks in turn.
//                    Grid: ceil(N / warps). Block: warps x 32 threads.
//   int4_dequantize: prefill. W -> dense (N, K) scratch for the GEMM.
//                    Grid: (N). Block: threads stride over the row's chunks.
#include "common.cuh"
#include "gemv.cuh"  // kMaxTokens

using namespace rawpage;

// The 32 values of chunk c of a row (4 words at w + 4c) as floats 0..15.
__device__ __forceinline__ void unpack_chunk(const unsigned* __restrict__ w, int c, float* q) {
  const uint4 v = reinterpret_cast<const uint4*>(w)[c];
  const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) q[8 * i + j] = float((words[i] >> (4 * j)) & 15u);
}


template <typename T>
__device__ void int4_gemv(T* __restrict__ out,               // [T, N]
                          const T* __restrict__ x,           // [T, K], stored column order, rows 16-byte aligned
                          const unsigned* __restrict__ w,    // [N, K / 8]
                          const __half* __restrict__ scales, // [N, K / G]
                          const __half* __restrict__ zeros,  // [N, K / G]
                          const T* __restrict__ bias,        // [N], read only if has_bias
                          int has_bias, int num_tokens, int N, int K, int G) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n = blockIdx.x * (blockDim.x / 32) + warp;  // this warp's output row
  if (n >= N) return;                                   // whole warps leave; no barrier follows
  const int groups = K / G;
  const unsigned* row = w + i64(n) * (K / 8);

  float acc[kMaxTokens] = {};
  for (int c = lane; c < K / 32; c += 32) {
    float q[32];
    unpack_chunk(row, c, q);
    const i64 g = i64(n) * groups + (32 * c) / G;
    const float s = __half2float(scales[g]), z = __half2float(zeros[g]);
#pragma unroll
    for (int t = 0; t < kMaxTokens; ++t) {
      if (t >= num_tokens) break;
      float xc[32];
      load_floats<T, 32>(x + i64(t) * K + 32 * c, xc);
      float qx = 0.0f, xsum = 0.0f;  // sum q x, sum x over the chunk
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        qx += q[i] * xc[i];
        xsum += xc[i];
      }
      acc[t] += s * (qx - z * xsum);
    }
  }
#pragma unroll
  for (int t = 0; t < kMaxTokens; ++t) {
    if (t >= num_tokens) break;
    const float y = warp_sum(acc[t]);  // y[t, n] = the warp's total
    if (lane == 0) out[i64(t) * N + n] = from_float<T>(y + (has_bias ? to_float(bias[n]) : 0.0f));
  }
}

template <typename T>
__device__ void int4_dequantize(T* __restrict__ out,                // [N, K]
                                const unsigned* __restrict__ w,     // [N, K / 8]
                                const __half* __restrict__ scales,  // [N, K / G]
                                const __half* __restrict__ zeros,   // [N, K / G]
                                int K, int G) {
  const int n = blockIdx.x;
  for (int c = threadIdx.x; c < K / 32; c += blockDim.x) {
    float q[32];
    unpack_chunk(w + i64(n) * (K / 8), c, q);
    const i64 g = i64(n) * (K / G) + (32 * c) / G;
    const float s = __half2float(scales[g]), z = __half2float(zeros[g]);
#pragma unroll
    for (int i = 0; i < 32; ++i) out[i64(n) * K + 32 * c + i] = from_float<T>(s * (q[i] - z));
  }
}

#define INT4_ENTRIES(T, suffix)                                                                            \
  extern "C" __global__ void int4_gemv_##suffix(T* out, const T* x, const unsigned* w, const __half* scales, \
                                                const __half* zeros, const T* bias, int has_bias,            \
                                                int num_tokens, int N, int K, int G) {                       \
    int4_gemv<T>(out, x, w, scales, zeros, bias, has_bias, num_tokens, N, K, G);                             \
  }                                                                                                          \
  extern "C" __global__ void int4_dequantize_##suffix(T* out, const unsigned* w, const __half* scales,       \
                                                      const __half* zeros, int K, int G) {                   \
    int4_dequantize<T>(out, w, scales, zeros, K, G);                                                         \
  }

INT4_ENTRIES(float, f32)
INT4_ENTRIES(__half, f16)
INT4_ENTRIES(__nv_bfloat16, bf16)
