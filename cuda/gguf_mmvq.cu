// GGUF decode with integer dot products (llama.cpp's MMVQ idea):  y = x W^T (+ bias)
// for a few tokens (T <= 8), W (N, K) in ggml blocks as stored in the .gguf file
// (the formats are drawn in gguf_linear.cu).
//
// The activation is quantized first, per 32-value chunk c of each token's row
// (q8_1 without the stored sum):
//     dx[t, c] = max_i |x[t, 32c + i]| / 127,   xq[t, 32c + i] = round(x / dx) in int8
// Every format's chunk is, per half h of 16 values, an affine map of small integers:
//     W[n, 32c + 16h + i] = a_h q_i + b_h,   q_i in -128..127 (Q8_0) or 0..63 (the rest)
//   Q8_0  a = d,         b = 0             Q4_0  a = d,          b = -8 d
//   Q4_1  a = d,         b = m             Q4_K  a = d sc_j,     b = -dmin m_j
//   Q5_K  as Q4_K, 5-bit q                 Q6_K  a_h = d sc_h,   b_h = -32 a_h (a scale per 16)
// so a chunk's dot product is
//     sum_i W x = dx sum_h ( a_h sum_i q_i xq_i  +  b_h sum_i xq_i )
// and both sums are four __dp4a each (4 int8 products and a sum per instruction).
// The weight's integers are unpacked with word-wide masks: a 32-bit load of
// nibble-packed bytes gives four 4-bit values with one AND.
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


// 4 bytes at a 2-byte-aligned address (every GGUF block size and field offset is even).
__device__ __forceinline__ int ld32(const u8* p) {
  const unsigned short* h = reinterpret_cast<const unsigned short*>(p);
  return int(unsigned(h[0]) | (unsigned(h[1]) << 16));
}

constexpr int kNib = 0x0F0F0F0F;

// A chunk as integers: q[w] packs values 4w .. 4w+3 (int8 each); half h = words
// 4h .. 4h+3; value = a[h] q + b[h].
struct Q8_0 {
  static constexpr int kBlock = 32, kBytes = 34;
  __device__ static void chunk(const u8* blk, int, int* q, float* a, float* b) {
#pragma unroll
    for (int w = 0; w < 8; ++w) q[w] = ld32(blk + 2 + 4 * w);
    a[0] = a[1] = f16_at(blk);
    b[0] = b[1] = 0.0f;
  }
};

struct Q4_0 {
  static constexpr int kBlock = 32, kBytes = 18;
  __device__ static void chunk(const u8* blk, int, int* q, float* a, float* b) {
#pragma unroll
    for (int w = 0; w < 4; ++w) {  // byte i: value i low, value i + 16 high
      const int v = ld32(blk + 2 + 4 * w);
      q[w] = v & kNib;
      q[w + 4] = (v >> 4) & kNib;
    }
    a[0] = a[1] = f16_at(blk);
    b[0] = b[1] = -8.0f * a[0];
  }
};

struct Q4_1 {
  static constexpr int kBlock = 32, kBytes = 20;
  __device__ static void chunk(const u8* blk, int, int* q, float* a, float* b) {
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const int v = ld32(blk + 4 + 4 * w);
      q[w] = v & kNib;
      q[w + 4] = (v >> 4) & kNib;
    }
    a[0] = a[1] = f16_at(blk);
    b[0] = b[1] = f16_at(blk + 2);
  }
};

// Chunk j's a = d sc_j and b = -dmin m_j of a Q4_K / Q5_K superblock (gguf_blocks.cuh).
__device__ __forceinline__ void k_affine(const u8* blk, int j, float* a, float* b) {
  int sc, m;
  k_scale_min(blk, j, &sc, &m);
  a[0] = a[1] = f16_at(blk) * float(sc);
  b[0] = b[1] = -f16_at(blk + 2) * float(m);
}

struct Q4_K {
  static constexpr int kBlock = 256, kBytes = 144;
  __device__ static void chunk(const u8* blk, int j, int* q, float* a, float* b) {
    const u8* qs = blk + 16 + 32 * (j / 2);  // chunk 2g low nibbles, 2g + 1 high
    const int shift = 4 * (j % 2);
#pragma unroll
    for (int w = 0; w < 8; ++w) q[w] = (ld32(qs + 4 * w) >> shift) & kNib;
    k_affine(blk, j, a, b);
  }
};

struct Q5_K {
  static constexpr int kBlock = 256, kBytes = 176;
  __device__ static void chunk(const u8* blk, int j, int* q, float* a, float* b) {
    const u8* qh = blk + 16;  // bit j of qh[l]: bit 4 of value l of chunk j
    const u8* qs = blk + 48 + 32 * (j / 2);
    const int shift = 4 * (j % 2);
#pragma unroll
    for (int w = 0; w < 8; ++w) q[w] = ((ld32(qs + 4 * w) >> shift) & kNib) | (((ld32(qh + 4 * w) >> j) & 0x01010101) << 4);
    k_affine(blk, j, a, b);
  }
};

struct Q6_K {
  static constexpr int kBlock = 256, kBytes = 210;
  __device__ static void chunk(const u8* blk, int j, int* q, float* a, float* b) {
    const int h = j / 4, r = j % 4;
    const u8* ql = blk + 64 * h + 32 * (r % 2);
    const u8* qh = blk + 128 + 32 * h;
    const signed char* sc = reinterpret_cast<const signed char*>(blk + 192) + 8 * h + 2 * r;
    const int lo_shift = 4 * (r / 2), hi_shift = 2 * r;
#pragma unroll
    for (int w = 0; w < 8; ++w)
      q[w] = ((ld32(ql + 4 * w) >> lo_shift) & kNib) | (((ld32(qh + 4 * w) >> hi_shift) & 0x03030303) << 4);
    const float d = f16_at(blk + 208);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      a[i] = d * float(sc[i]);
      b[i] = -32.0f * a[i];
    }
  }
};

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
  constexpr int kChunks = F::kBlock / 32;
  const int chunks = K / 32;
  const u8* row = w + i64(n) * (K / F::kBlock) * F::kBytes;

  float acc[kMaxTokens] = {};
  for (int c = lane; c < chunks; c += 32) {
    int q[8];
    float a[2], b[2];
    F::chunk(row + (c / kChunks) * F::kBytes, c % kChunks, q, a, b);
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
        dot += a[h] * float(qx) + b[h] * float(xs);
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

MMVQ_FORMAT(Q8_0)
MMVQ_FORMAT(Q4_0)
MMVQ_FORMAT(Q4_1)
MMVQ_FORMAT(Q4_K)
MMVQ_FORMAT(Q5_K)
MMVQ_FORMAT(Q6_K)

#define QUANTIZE_ENTRY(T, suffix)                                                                         \
  extern "C" __global__ void quantize_q8_##suffix(signed char* xq, float* dx, const T* x, int chunks) { \
    quantize_q8<T>(xq, dx, x, chunks);                                                                    \
  }

QUANTIZE_ENTRY(float, f32)
QUANTIZE_ENTRY(__half, f16)
QUANTIZE_ENTRY(__nv_bfloat16, bf16)
