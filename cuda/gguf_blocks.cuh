// GGUF block formats on the GPU: one struct a format, the only per-format code of both
// GGUF kernels (gguf_linear.cu dequantizes to floats, gguf_mmvq.cu dots integers with
// __dp4a). rawpage/quantization/gguf.py FORMATS is the same table in NumPy, and its
// decoders are the reference the tests hold these to.
//
// Both kernels work in *chunks* of 32 consecutive values of a weight row: a 32-block is
// one chunk, a 256-superblock is 8. F::chunk(blk, j, q, a, b) gives chunk j of a block as
// eight words of four int8 (q[w] packs values 4w .. 4w+3) and an affine map per half h
// (16 values):
//     value 16h + i  =  a[h] (q_i - kOffset) + b[h]
// q stays within int8 because __dp4a multiplies signed by signed bytes: unsigned quants
// (at most 63) keep their zero point in kOffset, Q8_0 and IQ4 give signed values.
//
//   format  bytes/values  layout                                         value (b = the min term)
//   Q8_0    34 / 32   [d f16][q int8 x32]                                d q
//   Q4_0    18 / 32   [d f16][qs x16]                                    d (q - 8)
//   Q4_1    20 / 32   [d f16][m f16][qs x16]                             d q + m
//   Q5_0    22 / 32   [d f16][qh x4][qs x16]                             d (q - 16)
//   Q5_1    24 / 32   [d f16][m f16][qh x4][qs x16]                      d q + m
//   IQ4_NL  18 / 32   [d f16][qs x16]                                    d L[q]
//            qs[i] holds value i in its low nibble and value i + 16 in its high one; Q5's
//            fifth bit: bit i of the 32-bit qh is bit 4 of value i. L: ggml's kvalues_iq4nl.
//   Q2_K    84 / 256  [scales x16][qs x64][d f16][dmin f16]              d sc_g q - dmin m_g
//            a scale per 16 values: sc_g the low nibble of scales[g], m_g the high one.
//            Half h (values 128h ..) reads qs[32h ..); its chunk j is bits 2j, 2j+1 of qs[32h + l].
//   Q3_K   110 / 256  [hmask x32][qs x64][scales x12][d f16]             d (sc_g - 32) (q - 4)
//            low 2 bits as Q2_K's; bit 2 of value l of chunk 4h + j is bit 4h + j of hmask[l].
//            16 6-bit scales: the low 4 bits are nibble g / 8 of scales[g % 8], the top 2
//            bits 2 (g / 4) of scales[8 + g % 4].
//   Q4_K   144 / 256  [d f16][dmin f16][scales x12][qs x128]             d sc_j q - dmin m_j
//            a 6-bit scale and min per chunk (k_scale_min). Chunks 2g and 2g+1 share
//            qs[32g ..): chunk 2g in the low nibbles, 2g+1 in the high ones.
//   Q5_K   176 / 256  [d f16][dmin f16][scales x12][qh x32][qs x128]     as Q4_K, 5-bit q
//            bit j of qh[l] is bit 4 of value l of chunk j.
//   Q6_K   210 / 256  [ql x128][qh x64][scales int8 x16][d f16]          d sc_g (q - 32)
//            q = 4 low bits from ql, 2 high bits from qh, an int8 scale per 16 values.
//            Half h (values 128h ..) uses ql[64h ..), qh[32h ..), scales[8h ..); its chunk r
//            takes nibble r/2 of ql[l + 32 (r%2)] and bits 2r, 2r+1 of qh[l].
//   IQ4_XS 136 / 256  [d f16][scales_h u16][scales_l x4][qs x128]        d (sc_j - 32) L[q]
//            chunk j's 16 bytes qs[16j ..) as IQ4_NL's; its 6-bit scale is nibble j%2 of
//            scales_l[j/2] and bits 2j, 2j+1 of scales_h.
//
// The integers are unpacked with word-wide masks: a 32-bit load of nibble-packed bytes
// gives four 4-bit values with one AND.
#pragma once

#include "common.cuh"

namespace rawpage {

using u8 = unsigned char;  // NVRTC has no <cstdint>

// A half at a 2-byte-aligned address: every block size and field offset is even.
__device__ __forceinline__ float f16_at(const u8* p) { return __half2float(*reinterpret_cast<const __half*>(p)); }

// 4 bytes at a 2-byte-aligned address.
__device__ __forceinline__ int ld32(const u8* p) {
  const unsigned short* h = reinterpret_cast<const unsigned short*>(p);
  return int(unsigned(h[0]) | (unsigned(h[1]) << 16));
}

constexpr int kNib = 0x0F0F0F0F;

// Bits 0-3 of x to bit 0 of bytes 0-3: x * 0x00204081 = x + x<<7 + x<<14 + x<<21, four
// copies that do not overlap, and bit 8k of it is bit k of x.
__device__ __forceinline__ int spread4(int x) { return ((x & 15) * 0x00204081) & 0x01010101; }

// A 32-value chunk of nibbles, qs[i] = value i (low) | value i + 16 (high).
__device__ __forceinline__ void nibbles(const u8* qs, int* q) {
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const int v = ld32(qs + 4 * w);
    q[w] = v & kNib;
    q[w + 4] = (v >> 4) & kNib;
  }
}

// Q5_0 / Q5_1: the nibbles, and bit i of the 32-bit qh as bit 4 of value i.
__device__ __forceinline__ void q5_values(const u8* qh, const u8* qs, int* q) {
  nibbles(qs, q);
  const int h = ld32(qh);
#pragma unroll
  for (int w = 0; w < 8; ++w) q[w] |= spread4(h >> (4 * w)) << 4;
}

// Q2_K / Q3_K: chunk 4h + j's low 2 bits, bits 2j, 2j+1 of qs[32h + l].
__device__ __forceinline__ void k_2bit_values(const u8* qs, int j, int* q) {
#pragma unroll
  for (int w = 0; w < 8; ++w) q[w] = (ld32(qs + 32 * (j / 4) + 4 * w) >> (2 * (j % 4))) & 0x03030303;
}

// IQ4's values L[0..15] (ggml's kvalues_iq4nl: -127 -104 -83 -65 -49 -35 -22 -10 1 13 25
// 38 53 69 89 113) as bytes: L[k] is byte k % 8 of word k / 8. A lookup in registers,
// not memory: the lanes' indices differ, which a __constant__ table would serialize.
constexpr unsigned long long kIq4Lo = 0xF6EADDCFBFAD9881ull, kIq4Hi = 0x7159453526190D01ull;

// Four 4-bit indices, one a byte, -> their four int8 values L[k], packed the same way.
__device__ __forceinline__ int iq4_lookup(int idx) {
  unsigned out = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int i = (idx >> (8 * k)) & 15;
    out |= unsigned(((i < 8 ? kIq4Lo : kIq4Hi) >> (8 * (i & 7))) & 0xFF) << (8 * k);
  }
  return int(out);
}

// IQ4_NL / IQ4_XS: a chunk of nibbles, each an index into L.
__device__ __forceinline__ void iq4_values(const u8* qs, int* q) {
  nibbles(qs, q);
#pragma unroll
  for (int w = 0; w < 8; ++w) q[w] = iq4_lookup(q[w]);
}

// The 6-bit scale sc and min m of chunk j of a Q4_K / Q5_K superblock
// b = [d f16][dmin f16][12 scale bytes]...: chunks 0-3 keep them in the low 6 bits
// of bytes j and j+4; chunks 4-7 in the nibbles of byte j+4, with their top 2 bits
// in the spare top bits of bytes j-4 (scale) and j (min).
__device__ __forceinline__ void k_scale_min(const u8* b, int j, int* sc, int* m) {
  const u8* s = b + 4;
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Chunk j's a = d sc_j and b = -dmin m_j of a Q4_K / Q5_K superblock.
__device__ __forceinline__ void k_affine(const u8* blk, int j, float* a, float* b) {
  int sc, m;
  k_scale_min(blk, j, &sc, &m);
  a[0] = a[1] = f16_at(blk) * float(sc);
  b[0] = b[1] = -f16_at(blk + 2) * float(m);
}

// ---- one struct a format (the table above) ----------------------------------------------

// The 32-blocks' affine map, the same for both halves: a = d (the f16 at byte 0), and
// b = m (the f16 at byte 2) for Q4_1 / Q5_1, else 0.
__device__ __forceinline__ void block32_affine(const u8* blk, bool has_min, float* a, float* b) {
  a[0] = a[1] = f16_at(blk);
  b[0] = b[1] = has_min ? f16_at(blk + 2) : 0.0f;
}

struct Q8_0 {
  static constexpr int kBlock = 32, kBytes = 34, kOffset = 0;
  __device__ static void chunk(const u8* blk, int, int* q, float* a, float* b) {
#pragma unroll
    for (int w = 0; w < 8; ++w) q[w] = ld32(blk + 2 + 4 * w);
    block32_affine(blk, false, a, b);
  }
};

struct Q4_0 {
  static constexpr int kBlock = 32, kBytes = 18, kOffset = 8;
  __device__ static void chunk(const u8* blk, int, int* q, float* a, float* b) {
    nibbles(blk + 2, q);
    block32_affine(blk, false, a, b);
  }
};

struct Q4_1 {
  static constexpr int kBlock = 32, kBytes = 20, kOffset = 0;
  __device__ static void chunk(const u8* blk, int, int* q, float* a, float* b) {
    nibbles(blk + 4, q);
    block32_affine(blk, true, a, b);
  }
};

struct Q5_0 {
  static constexpr int kBlock = 32, kBytes = 22, kOffset = 16;
  __device__ static void chunk(const u8* blk, int, int* q, float* a, float* b) {
    q5_values(blk + 2, blk + 6, q);
    block32_affine(blk, false, a, b);
  }
};

struct Q5_1 {
  static constexpr int kBlock = 32, kBytes = 24, kOffset = 0;
  __device__ static void chunk(const u8* blk, int, int* q, float* a, float* b) {
    q5_values(blk + 4, blk + 8, q);
    block32_affine(blk, true, a, b);
  }
};

struct Q2_K {
  static constexpr int kBlock = 256, kBytes = 84, kOffset = 0;
  __device__ static void chunk(const u8* blk, int j, int* q, float* a, float* b) {
    k_2bit_values(blk + 16, j, q);
    const float d = f16_at(blk + 80), dmin = f16_at(blk + 82);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int s = blk[2 * j + h];  // scale group 2j + h
      a[h] = d * float(s & 15);
      b[h] = -dmin * float(s >> 4);
    }
  }
};

struct Q3_K {
  static constexpr int kBlock = 256, kBytes = 110, kOffset = 4;
  __device__ static void chunk(const u8* blk, int j, int* q, float* a, float* b) {
    k_2bit_values(blk + 32, j, q);
#pragma unroll
    for (int w = 0; w < 8; ++w) q[w] |= ((ld32(blk + 4 * w) >> j) & 0x01010101) << 2;  // bit j of hmask[l]
    const u8* s = blk + 96;
    const float d = f16_at(blk + 108);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int g = 2 * j + h;
      const int sc = ((s[g % 8] >> (4 * (g / 8))) & 15) | (((s[8 + g % 4] >> (2 * (g / 4))) & 3) << 4);
      a[h] = d * float(sc - 32);
      b[h] = 0.0f;
    }
  }
};

struct Q4_K {
  static constexpr int kBlock = 256, kBytes = 144, kOffset = 0;
  __device__ static void chunk(const u8* blk, int j, int* q, float* a, float* b) {
    const u8* qs = blk + 16 + 32 * (j / 2);  // chunk 2g low nibbles, 2g + 1 high
    const int shift = 4 * (j % 2);
#pragma unroll
    for (int w = 0; w < 8; ++w) q[w] = (ld32(qs + 4 * w) >> shift) & kNib;
    k_affine(blk, j, a, b);
  }
};

struct Q5_K {
  static constexpr int kBlock = 256, kBytes = 176, kOffset = 0;
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
  static constexpr int kBlock = 256, kBytes = 210, kOffset = 32;
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
      b[i] = 0.0f;
    }
  }
};

struct IQ4_NL {
  static constexpr int kBlock = 32, kBytes = 18, kOffset = 0;
  __device__ static void chunk(const u8* blk, int, int* q, float* a, float* b) {
    iq4_values(blk + 2, q);
    block32_affine(blk, false, a, b);
  }
};

struct IQ4_XS {
  static constexpr int kBlock = 256, kBytes = 136, kOffset = 0;
  __device__ static void chunk(const u8* blk, int j, int* q, float* a, float* b) {
    iq4_values(blk + 8 + 16 * j, q);
    const int scales_h = blk[2] | (blk[3] << 8);
    const int sc = ((blk[4 + j / 2] >> (4 * (j % 2))) & 15) | (((scales_h >> (2 * j)) & 3) << 4);
    a[0] = a[1] = f16_at(blk) * float(sc - 32);
    b[0] = b[1] = 0.0f;
  }
};

// Every format both kernels instantiate: X(F) for each struct above. A new format is a
// struct and an entry here (and a row of gguf.py's FORMATS).
#define RP_GGUF_CUDA_FORMATS(X) \
  X(Q8_0)                       \
  X(Q4_0)                       \
  X(Q4_1)                       \
  X(Q5_0)                       \
  X(Q5_1)                       \
  X(Q2_K)                       \
  X(Q3_K)                       \
  X(Q4_K)                       \
  X(Q5_K)                       \
  X(Q6_K)                       \
  X(IQ4_NL)                     \
  X(IQ4_XS)

// The blocks of output row n of a weight (N, K): K / kBlock blocks of kBytes.
template <typename F>
__device__ __forceinline__ const u8* block_row(const u8* w, int n, int K) {
  return w + i64(n) * (K / F::kBlock) * F::kBytes;
}

// Chunk c of a row: block c / (kBlock / 32), chunk c % (kBlock / 32) inside it.
template <typename F>
__device__ __forceinline__ void row_chunk(const u8* row, int c, int* q, float* a, float* b) {
  constexpr int kChunks = F::kBlock / 32;
  F::chunk(row + (c / kChunks) * F::kBytes, c % kChunks, q, a, b);
}

}  // namespace rawpage
