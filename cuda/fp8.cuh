// FP8 e4m3 ("e4m3fn") <-> float, in plain integer and float operations, so that
// the same code runs on every GPU (sm_80 has no FP8 instructions) and in the simulator.
//
//   bit  7     6 5 4 3    2 1 0
//        sign  exponent   mantissa     bias 7; (-1)^s 2^(e-7) (1 + m/8); e = 0: 2^-6 m/8
//
// Both directions use one trick: the 7 value bits, shifted up 20 places, are a float
// whose exponent is e and mantissa m/8; that float times 2^120 (bias 127 - 7) is the
// e4m3 value, subnormals included (they become float subnormals, which CUDA keeps
// unless compiled with fast math). The code 0x7f (NaN) decodes as 480; we never
// write it, because encoding saturates at 448.
#pragma once

namespace rawpage {

__device__ __forceinline__ float e4m3_to_float(unsigned char b) {
  const float mag = __int_as_float(int(b & 0x7Fu) << 20) * 0x1p120f;
  return (b & 0x80u) ? -mag : mag;
}

// Round to nearest even, saturating to +-448 (as cvt.rn.satfinite.e4m3x2.f32).
__device__ __forceinline__ unsigned char float_to_e4m3(float x) {
  const unsigned sign = (__float_as_uint(x) >> 24) & 0x80u;
  const unsigned bits = __float_as_uint(fminf(fabsf(x), 448.0f) * 0x1p-120f);
  const unsigned code = (bits + 0x7FFFFu + ((bits >> 20) & 1u)) >> 20;  // drop 20 bits, ties to even
  return static_cast<unsigned char>(sign | code);
}

// One e4m3 element of an FP8 KV cache, as a type of its own, so that the attention
// kernels read it through the same to_float() as __half and __nv_bfloat16.
struct fp8_e4m3 {
  unsigned char bits;
};
__device__ __forceinline__ float to_float(fp8_e4m3 x) { return e4m3_to_float(x.bits); }

}  // namespace rawpage
