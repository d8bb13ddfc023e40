// GGUF decode with integer dot products (llama.cpp's MMVQ idea):  y = x W^T (+ bias)
// for a few tokens (T <= 8), W (N, K) in ggml blocks as stored in the .gguf file
// (the formats, drawn and unpacked: gguf_blocks.cuh).
//
// The activation is quantized first, per 32-value chunk c of each token's row
// (q8_1 without the stored sum):
//     dx[t, c] = max_i |x[t, 32c + i]| / 127,   xq[t, 32c + i] = round(x / dx) in int8
// Every format's chunk is, per half h of 16 values, an affine map of int8 integers
// (F::chunk, gguf_blocks.cuh):
//     W[n, 32c + 16h + i] = a_h (q_i - kOffset) + b_h
// so a chunk's dot product is
//     sum_i W x = dx sum_h ( a_h (sum_i q_i xq_i - kOffset sum_i xq_i)  +  b_h sum_i xq_i )
// and both sums are exact integers, four __dp4a each (4 int8 products and a sum per
// instruction).
//
// Two kernels:
//   quantize_q8:  x (T, K) -> xq (T, K) int8, dx (T, K / 32) float.
//                 Grid: ceil(T K / 32 / 8). Block: 8 warps; a warp quantizes one
//                 chunk, a lane one value (max by warp shuffles).
//   gguf_mmvq:    one warp per output row n, computing y[t, n] for all T tokens, so
//                 each weight block is read and unpacked once per step, not per token.
//                 Lanes take the row's chunks in turn; the warp sums.
//                 Grid: ceil(N / 8). Block: 8 warps x 32 threads.
#include "common.cuh"
#include "gguf_blocks.cuh"
#include "gemv.cuh"  // kMaxTokens

using namespace rawpage;

template <typename T>
__device__ void quantize_q8(signed char* __restrict__ xq,  // [T, K]
                            float* __restrict__ dx,        // [T, K / 32]
                            const T* __restrict__ x,       // [T, K]
                            int chunks) {                  // T * K / 32
  const int c = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (c >= chunks) return;  // whole warps leave; no barrier follows
  const float v = to_float(x[i64(c) * 32 + lane]);
  float amax = fabsf(v);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float d = amax / 127.0f;
  xq[i64(c) * 32 + lane] = static_cast<signed char>(d > 0.0f ? int(rintf(v / d)) : 0);
  if (lane == 0) dx[c] = d;
}

template <typename F, typename T>
__device__ void gguf_mmvq(T* __restrict__ out,                // [T, N]
                          const signed char* __restrict__ xq, // [T, K], rows 16-byte aligned
                          const float* __restrict__ dx,       // [T, K / 32]
                          const u8* __restrict__ w,           // [N, K / kBlock blocks of kBytes]
                          const T* __restrict__ bias,         // [N], read only if has_bias
                          int has_bias, int num_tokens, int N, int K) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n = blockIdx.x * (blockDim.x / 32) + warp;  // this warp's output row
  if (n >= N) return;                                   // whole warps leave; no barrier follows
  const int chunks = K / 32;
  const u8* row = block_row<F>(w, n, K);

  float acc[kMaxTokens] = {};
  for (int c = lane; c < chunks; c += 32) {
    int q[8];
    float a[2], b[2];
    row_chunk<F>(row, c, q, a, b);
#pragma unroll
    for (int t = 0; t < kMaxTokens; ++t) {
      if (t >= num_tokens) break;
      const uint4* xv = reinterpret_cast<const uint4*>(xq + i64(t) * K + 32 * c);
      const uint4 lo = xv[0], hi = xv[1];
      const int xw[8] = {int(lo.x), int(lo.y), int(lo.z), int(lo.w), int(hi.x), int(hi.y), int(hi.z), int(hi.w)};
      float dot = 0.0f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        int qx = 0, xs = 0;  // sum q xq, sum xq over the half
#pragma unroll
        for (int i = 4 * h; i < 4 * h + 4; ++i) {
          qx = __dp4a(q[i], xw[i], qx);
          xs = __dp4a(0x01010101, xw[i], xs);
        }
        dot += a[h] * float(qx - F::kOffset * xs) + b[h] * float(xs);
      }
      acc[t] += dx[i64(t) * chunks + c] * dot;
    }
  }
#pragma unroll
  for (int t = 0; t < kMaxTokens; ++t) {
    if (t >= num_tokens) break;
    const float y = warp_sum(acc[t]);  // y[t, n] = the warp's total
    if (lane == 0) out[i64(t) * N + n] = from_float<T>(y + (has_bias ? to_float(bias[n]) : 0.0f));
  }
}

#define MMVQ_ENTRIES(F, T, suffix)                                                                              \
  extern "C" __global__ void gguf_mmvq_##F##_##suffix(T* out, const signed char* xq, const float* dx,         \
                                                      const u8* w, const T* bias, int has_bias,               \
                                                      int num_tokens, int N, int K) {                         \
    gguf_mmvq<F, T>(out, xq, dx, w, bias, has_bias, num_tokens, N, K);                                         \
  }

#define MMVQ_FORMAT(F)                 \
  MMVQ_ENTRIES(F, float, f32)          \
  MMVQ_ENTRIES(F, __half, f16)         \
  MMVQ_ENTRIES(F, __nv_bfloat16, bf16)

RP_GGUF_CUDA_FORMATS(MMVQ_FORMAT)

#define QUANTIZE_ENTRY(T, suffix)                                                                         \
  extern "C" __global__ void quantize_q8_##suffix(signed char* xq, float* dx, const T* x, int chunks) { \
    quantize_q8<T>(xq, dx, x, chunks);                                                                    \
  }

QUANTIZE_ENTRY(float, f32)
QUANTIZE_ENTRY(__half, f16)
QUANTIZE_ENTRY(__nv_bfloat16, bf16)
