// Linear layers on GGUF weights kept quantized:  y = x W^T (+ bias),  W (N, K) in
// ggml's block formats, read as stored in the .gguf file.
//
// Every format splits a weight row into blocks of 32 (or 256) values that share a
// scale. We always work in *chunks* of 32 consecutive values of a row: a 32-block is
// one chunk, a 256-superblock is 8. Each format's F::chunk (gguf_blocks.cuh, where the
// layouts are drawn) gives a chunk as int8 integers q and an affine map per 16 values;
// `dequant_row_chunk` turns that back into 32 floats:
//     w_i = a_h (q_i - kOffset) + b_h,    h = i / 16
// the canonical decode of rawpage/quantization/gguf.py (d sc_g (L[q] - offset) - dm m_g).
//
// Two kernels:
//   gguf_gemv:       decode (a few tokens). One warp per output row, after
//                    llama.cpp's MMVQ: lanes take the row's chunks in turn, dequantize
//                    32 weights, dot them with x (read through L1/L2: at batch 1 the
//                    weight bytes are the traffic), and the warp sums. No shared memory.
//                    Grid: (ceil(N / warps), T). Block: warps x 32 threads.
//   gguf_dequantize: prefill. W -> a dense (N, K) scratch in the activation dtype,
//                    which the caller hands to cuBLAS (or NumPy under sim).
//                    Grid: (N). Block: threads stride over the row's chunks.
#include "common.cuh"
#include "gguf_blocks.cuh"

using namespace rawpage;

// Chunk c of a row of blocks as 32 floats y.
template <typename F>
__device__ __forceinline__ void dequant_row_chunk(const u8* row, int c, float* y) {
  int q[8];
  float a[2], b[2];
  row_chunk<F>(row, c, q, a, b);
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int qi = static_cast<signed char>(q[i / 4] >> (8 * (i % 4)));  // byte i % 4 of word i / 4
    y[i] = a[i / 16] * float(qi - F::kOffset) + b[i / 16];
  }
}

template <typename F, typename T>
__device__ void gguf_gemv(T* __restrict__ out,              // [T, N]
                          const T* __restrict__ x,          // [T, K], rows 16-byte aligned
                          const u8* __restrict__ w,    // [N, K / kBlock blocks of kBytes]
                          const T* __restrict__ bias,       // [N], read only if has_bias
                          int has_bias, int N, int K) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n = blockIdx.x * (blockDim.x / 32) + warp;  // this warp's output row
  if (n >= N) return;                                   // whole warps leave; no barrier follows
  const int t = blockIdx.y;
  const u8* row = block_row<F>(w, n, K);
  const T* xt = x + i64(t) * K;

  // acc = sum over this lane's chunks c of  W[n, 32c .. 32c+32) . x[32c .. 32c+32)
  float acc = 0.0f;
  for (int c = lane; c < K / 32; c += 32) {
    float wc[32], xc[32];
    dequant_row_chunk<F>(row, c, wc);
    load_floats<T, 32>(xt + 32 * c, xc);
#pragma unroll
    for (int i = 0; i < 32; ++i) acc += wc[i] * xc[i];
  }
  acc = warp_sum(acc);  // y[t, n] = the warp's total
  if (lane == 0) out[i64(t) * N + n] = from_float<T>(acc + (has_bias ? to_float(bias[n]) : 0.0f));
}

template <typename F, typename T>
__device__ void gguf_dequantize(T* __restrict__ out,            // [N, K]
                                const u8* __restrict__ w,  // [N, K / kBlock blocks of kBytes]
                                int K) {
  const int n = blockIdx.x;
  const u8* row = block_row<F>(w, n, K);
  for (int c = threadIdx.x; c < K / 32; c += blockDim.x) {
    float y[32];
    dequant_row_chunk<F>(row, c, y);
#pragma unroll
    for (int i = 0; i < 32; ++i) out[i64(n) * K + 32 * c + i] = from_float<T>(y[i]);
  }
}

#define GGUF_ENTRIES(F, T, suffix)                                                                    \
  extern "C" __global__ void gguf_gemv_##F##_##suffix(T* out, const T* x, const u8* w,           \
                                                      const T* bias, int has_bias, int N, int K) {    \
    gguf_gemv<F, T>(out, x, w, bias, has_bias, N, K);                                                 \
  }                                                                                                   \
  extern "C" __global__ void gguf_dequantize_##F##_##suffix(T* out, const u8* w, int K) {        \
    gguf_dequantize<F, T>(out, w, K);                                                                 \
  }

#define GGUF_FORMAT(F)                 \
  GGUF_ENTRIES(F, float, f32)          \
  GGUF_ENTRIES(F, __half, f16)         \
  GGUF_ENTRIES(F, __nv_bfloat16, bf16)

RP_GGUF_CUDA_FORMATS(GGUF_FORMAT)
