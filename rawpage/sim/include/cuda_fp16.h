// The simulator's <cuda_fp16.h>: IEEE binary16 stored as 16 bits, arithmetic
// done in float and rounded to nearest even, which is what CUDA's half
// instructions return for a single operation.
#pragma once
#ifndef RP_SIM_DISCOVER

#include <cstdint>
#include <cstring>

namespace rp_sim {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// float -> half, round to nearest even (F. Giesen's float_to_half_fast3_rtne).
inline uint16_t f32_to_f16_rn(float value) {
  uint32_t x = f32_bits(value);
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;
  uint16_t o;
  if (x >= 0x47800000u) {  // 65536 or more, inf or NaN
    o = x > 0x7f800000u ? 0x7e00 : 0x7c00;
  } else if (x < 0x38800000u) {  // below the smallest normal half: let the FPU round
    const float magic = f32_from_bits(0x3f000000u);  // 0.5: aligns the result's bits at the bottom
    o = uint16_t(f32_bits(f32_from_bits(x) + magic) - 0x3f000000u);
  } else {
    const uint32_t mant_odd = (x >> 13) & 1;
    x += 0xc8000fffu;  // rebias the exponent (15 - 127) << 23, and round: + 0xfff
    x += mant_odd;
    o = uint16_t(x >> 13);
  }
  return uint16_t(o | (sign >> 16));
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    const float f = float(mant) * 5.9604644775390625e-8f;
    return f32_from_bits(f32_bits(f) | sign);
  }
  if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (mant << 13));
  return f32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
}

}  // namespace rp_sim

struct __half_raw {
  unsigned short x;
};

struct __attribute__((aligned(2))) __half {
  unsigned short __x;
  __half() = default;
  __half(__half_raw r) : __x(r.x) {}
  __half(float f) : __x(rp_sim::f32_to_f16_rn(f)) {}
  __half(double f) : __x(rp_sim::f32_to_f16_rn(float(f))) {}
  __half(int i) : __x(rp_sim::f32_to_f16_rn(float(i))) {}
  __half(unsigned i) : __x(rp_sim::f32_to_f16_rn(float(i))) {}
  operator float() const { return rp_sim::f16_to_f32(__x); }
  operator __half_raw() const { return __half_raw{__x}; }
};

struct __attribute__((aligned(4))) __half2 {
  __half x, y;
};

inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline float __half2float(__half h) { return rp_sim::f16_to_f32(h.__x); }
inline __half __int2half_rn(int i) { return __half(float(i)); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline short __half_as_short(__half h) { return short(h.__x); }
inline __half __ushort_as_half(unsigned short u) { return __half(__half_raw{u}); }
inline __half __short_as_half(short s) { return __half(__half_raw{(unsigned short)s}); }

inline __half __hadd(__half a, __half b) { return __half(float(a) + float(b)); }
inline __half __hsub(__half a, __half b) { return __half(float(a) - float(b)); }
inline __half __hmul(__half a, __half b) { return __half(float(a) * float(b)); }
inline __half __hdiv(__half a, __half b) { return __half(float(a) / float(b)); }
inline __half __hfma(__half a, __half b, __half c) {
  return __half(float(double(float(a)) * float(b) + float(c)));
}
inline __half __hneg(__half a) { return __half(__half_raw{(unsigned short)(a.__x ^ 0x8000)}); }
inline __half __habs(__half a) { return __half(__half_raw{(unsigned short)(a.__x & 0x7fff)}); }
inline __half __hmax(__half a, __half b) { return float(a) < float(b) ? b : a; }
inline __half __hmin(__half a, __half b) { return float(b) < float(a) ? b : a; }
inline bool __heq(__half a, __half b) { return float(a) == float(b); }
inline bool __hlt(__half a, __half b) { return float(a) < float(b); }
inline bool __hgt(__half a, __half b) { return float(a) > float(b); }

inline __half operator+(__half a, __half b) { return __hadd(a, b); }
inline __half operator-(__half a, __half b) { return __hsub(a, b); }
inline __half operator*(__half a, __half b) { return __hmul(a, b); }
inline __half operator/(__half a, __half b) { return __hdiv(a, b); }
inline __half operator-(__half a) { return __hneg(a); }
inline __half& operator+=(__half& a, __half b) { return a = a + b; }
inline __half& operator-=(__half& a, __half b) { return a = a - b; }
inline __half& operator*=(__half& a, __half b) { return a = a * b; }
inline __half& operator/=(__half& a, __half b) { return a = a / b; }
inline bool operator==(__half a, __half b) { return float(a) == float(b); }
inline bool operator!=(__half a, __half b) { return float(a) != float(b); }
inline bool operator<(__half a, __half b) { return float(a) < float(b); }
inline bool operator>(__half a, __half b) { return float(a) > float(b); }
inline bool operator<=(__half a, __half b) { return float(a) <= float(b); }
inline bool operator>=(__half a, __half b) { return float(a) >= float(b); }

inline __half2 __halves2half2(__half a, __half b) { return __half2{a, b}; }
inline __half2 __half2half2(__half a) { return __half2{a, a}; }
inline __half2 __floats2half2_rn(float a, float b) { return __half2{__half(a), __half(b)}; }
inline __half2 __float22half2_rn(float2 f) { return __half2{__half(f.x), __half(f.y)}; }
inline __half2 __float2half2_rn(float a) { return __half2{__half(a), __half(a)}; }
inline float2 __half22float2(__half2 h) { return float2{float(h.x), float(h.y)}; }
inline __half __low2half(__half2 h) { return h.x; }
inline __half __high2half(__half2 h) { return h.y; }
inline float __low2float(__half2 h) { return float(h.x); }
inline float __high2float(__half2 h) { return float(h.y); }
inline __half2 __hadd2(__half2 a, __half2 b) { return __half2{a.x + b.x, a.y + b.y}; }
inline __half2 __hmul2(__half2 a, __half2 b) { return __half2{a.x * b.x, a.y * b.y}; }
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) {
  return __half2{__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)};
}

#endif  // RP_SIM_DISCOVER
