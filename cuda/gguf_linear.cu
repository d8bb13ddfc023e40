// Linear layers on GGUF weights kept quantized:  y = x W^T (+ bias),  W (N, K) in
// ggml's block formats, read as stored in the .gguf file.
//
// Every format splits a weight row into blocks of 32 (or 256) values that share a
// scale. We always work in *chunks* of 32 consecutive values of a row: a 32-block
// is one chunk, a 256-superblock is 8. `dequant_chunk` turns one chunk back into
// 32 floats; it is the only per-format code.
//
//   Q8_0   34 B / 32:  [d f16][q int8 x32]                         w = d q
//   Q4_0   18 B / 32:  [d f16][qs u8 x16]                          w = d (q - 8)
//   Q4_1   20 B / 32:  [d f16][m f16][qs u8 x16]                   w = d q + m
//            qs[i] holds value i in its low nibble and value i+16 in its high one.
//   Q4_K  144 B / 256: [d f16][dmin f16][scales u8 x12][qs u8 x128]
//            8 chunks; chunk j has a 6-bit scale sc_j and min m_j packed in `scales`;
//            w = d sc_j q - dmin m_j. Chunks 2g and 2g+1 share qs[32g .. 32g+32):
//            chunk 2g in the low nibbles, 2g+1 in the high ones.
//   Q5_K  176 B / 256: [d f16][dmin f16][scales x12][qh u8 x32][qs u8 x128]
//            as Q4_K, plus a fifth bit: bit j of qh[l] is bit 4 of value l of chunk j.
//   Q6_K  210 B / 256: [ql u8 x128][qh u8 x64][scales int8 x16][d f16]
//            w = d sc (q - 32), q = 4 low bits from ql, 2 high bits from qh, one
//            int8 scale per 16 values. Half h (values 128h ..) uses ql[64h ..),
//            qh[32h ..), scales[8h ..); its chunk r takes nibble r/2 of ql[l + 32 (r%2)]
//            and bits 2r, 2r+1 of qh[l].
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

// Bytes: NVRTC has no <cstdint> (u8 comes from gguf_blocks.cuh).
using s8 = signed char;


struct Q8_0 {
  static constexpr int kBlock = 32, kBytes = 34;
  __device__ static void dequant_chunk(const u8* b, int, float* y) {
    const float d = f16_at(b);
    const s8* q = reinterpret_cast<const s8*>(b + 2);
#pragma unroll
    for (int i = 0; i < 32; ++i) y[i] = d * float(q[i]);
  }
};

struct Q4_0 {
  static constexpr int kBlock = 32, kBytes = 18;
  __device__ static void dequant_chunk(const u8* b, int, float* y) {
    const float d = f16_at(b);
    const u8* qs = b + 2;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      y[i] = d * float(int(qs[i] & 15) - 8);
      y[i + 16] = d * float(int(qs[i] >> 4) - 8);
    }
  }
};

struct Q4_1 {
  static constexpr int kBlock = 32, kBytes = 20;
  __device__ static void dequant_chunk(const u8* b, int, float* y) {
    const float d = f16_at(b), m = f16_at(b + 2);
    const u8* qs = b + 4;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      y[i] = d * float(qs[i] & 15) + m;
      y[i + 16] = d * float(qs[i] >> 4) + m;
    }
  }
};

// Chunk j's  d * sc_j  and  dmin * m_j  of a Q4_K / Q5_K superblock (gguf_blocks.cuh).
__device__ __forceinline__ void k_chunk_scale(const u8* b, int j, float* d, float* dm) {
  int sc, m;
  k_scale_min(b, j, &sc, &m);
  *d = f16_at(b) * float(sc);
  *dm = f16_at(b + 2) * float(m);
}

struct Q4_K {
  static constexpr int kBlock = 256, kBytes = 144;
  __device__ static void dequant_chunk(const u8* b, int j, float* y) {
    float d, dm;
    k_chunk_scale(b, j, &d, &dm);
    const u8* qs = b + 16 + 32 * (j / 2);
    const int shift = 4 * (j % 2);
#pragma unroll
    for (int l = 0; l < 32; ++l) y[l] = d * float((qs[l] >> shift) & 15) - dm;
  }
};

struct Q5_K {
  static constexpr int kBlock = 256, kBytes = 176;
  __device__ static void dequant_chunk(const u8* b, int j, float* y) {
    float d, dm;
    k_chunk_scale(b, j, &d, &dm);
    const u8* qh = b + 16;
    const u8* qs = b + 48 + 32 * (j / 2);
    const int shift = 4 * (j % 2);
#pragma unroll
    for (int l = 0; l < 32; ++l) y[l] = d * float(((qs[l] >> shift) & 15) | (((qh[l] >> j) & 1) << 4)) - dm;
  }
};

struct Q6_K {
  static constexpr int kBlock = 256, kBytes = 210;
  __device__ static void dequant_chunk(const u8* b, int j, float* y) {
    const int h = j / 4, r = j % 4;
    const u8* ql = b + 64 * h + 32 * (r % 2);
    const u8* qh = b + 128 + 32 * h;
    const s8* sc = reinterpret_cast<const s8*>(b + 192) + 8 * h + 2 * r;
    const float d = f16_at(b + 208);
    const int lo_shift = 4 * (r / 2), hi_shift = 2 * r;
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      const int q = ((ql[l] >> lo_shift) & 15) | (((qh[l] >> hi_shift) & 3) << 4);
      y[l] = d * float(sc[l / 16]) * float(q - 32);
    }
  }
};

// Chunk c of a row: block c / (kBlock / 32), chunk c % (kBlock / 32) inside it.
template <typename F>
__device__ __forceinline__ void dequant_row_chunk(const u8* row, int c, float* y) {
  constexpr int kChunks = F::kBlock / 32;
  F::dequant_chunk(row + (c / kChunks) * F::kBytes, c % kChunks, y);
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
  const u8* row = w + i64(n) * (K / F::kBlock) * F::kBytes;
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
  const u8* row = w + i64(n) * (K / F::kBlock) * F::kBytes;
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

GGUF_FORMAT(Q8_0)
GGUF_FORMAT(Q4_0)
GGUF_FORMAT(Q4_1)
GGUF_FORMAT(Q4_K)
GGUF_FORMAT(Q5_K)
GGUF_FORMAT(Q6_K)
