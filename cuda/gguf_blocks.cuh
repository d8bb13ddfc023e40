// GGUF block fields both GGUF kernels read (gguf_linear.cu dequantizes them to
// floats, gguf_mmvq.cu to integers for __dp4a); the block layouts are drawn in
// gguf_linear.cu.
#pragma once

namespace rawpage {

using u8 = unsigned char;

// A half at a 2-byte-aligned address: every block size and field offset is even.
__device__ __forceinline__ float f16_at(const u8* p) { return __half2float(*reinterpret_cast<const __half*>(p)); }

// The 6-bit scale sc and min m of chunk j of a Q4_K / Q5_K superblock
// b = [d f16][dmin f16][12 scale bytes]...: chunks 0-3 keep them in the low 6 bits
// of bytes j and j+4; chunks 4-7 in the nibbles of byte j+4, with their top 2 bits
// in the spare top bits of bytes j-4 (scale) and j (min). Chunk j's values are
// d sc q - dmin m.
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

}  // namespace rawpage
