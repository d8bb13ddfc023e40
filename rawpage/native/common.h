/* Shared by every CPU kernel: the instruction-set path, float16 conversion, the
 * thread pool's interface.
 *
 * RP_ISA_LEVEL (set by rawpage/native/build.py from rawpage/native/isa.py) caps the
 * path a kernel takes; each kernel has its branches side by side under these macros,
 * best first, with a plain-C branch that defines the result:
 *
 *     RP_AVX512VNNI   3   vpdpbusd on 512-bit registers
 *     RP_AVXVNNI      2   vpdpbusd on 256-bit registers (AVX-VNNI, or AVX512-VNNI + VL)
 *     RP_AVX2         1   maddubs + madd, FMA, F16C
 *     (none)          0   plain C
 *
 * A lower level on a better CPU is still compiled with -march=native: the compiler
 * may vectorize the plain-C code, but the intrinsics each branch uses are its own.
 */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifndef RP_ISA_LEVEL
#define RP_ISA_LEVEL 0
#endif

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

#if RP_ISA_LEVEL >= 3 && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && \
    defined(__AVX512VL__)
#define RP_AVX512VNNI 1
#endif
#if RP_ISA_LEVEL >= 2 && defined(__AVX2__) && (defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__)))
#define RP_AVXVNNI 1
#endif
#if RP_ISA_LEVEL >= 1 && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define RP_AVX2 1
#endif

#define RP_EXPORT __attribute__((visibility("default")))

/* IEEE half <-> float, bit-exact (the GGUF block scales, a float16 KV cache). */
static inline float rp_f16_to_f32(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalize */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000 | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

static inline uint16_t rp_f32_to_f16(float f) { /* round to nearest even */
#if defined(__F16C__)
    return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t man = x & 0x7fffff;
    if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp), half = 1u << (shift - 1);
        uint32_t r = man >> shift, rest = man & ((1u << shift) - 1);
        if (rest > half || (rest == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = (uint32_t)(exp << 10) | (man >> 13), rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (r & 1))) r++;
    return (uint16_t)(sign | r);
#endif
}

/* The thread pool (pool.c). rp_parallel runs fn(arg, ith, nth) for ith = 0..nth-1:
 * ith 0 on the calling thread, the others on persistent workers, and returns when all
 * are done. Kernels split their rows with rp_split. */
typedef void (*rp_task)(void *arg, int ith, int nth);
void rp_parallel(rp_task fn, void *arg, int nth);

/* [*begin, *end) of n items for part ith of nth, in whole multiples of `quantum`. */
static inline void rp_split(int64_t n, int64_t quantum, int ith, int nth, int64_t *begin, int64_t *end) {
    int64_t units = (n + quantum - 1) / quantum;
    int64_t a = units * ith / nth, b = units * (ith + 1) / nth;
    *begin = a * quantum < n ? a * quantum : n;
    *end = b * quantum < n ? b * quantum : n;
}

/* The entry points' prototypes (and the GGUF format traits), generated from
 * rawpage/native/entry_points.py by build.py: each definition must match its entry. */
#include "rp_entry_points.h"
