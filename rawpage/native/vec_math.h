/* Float32 vector math the attention and layer kernels share: exp and tanh on
 * registers, and a few row helpers (dot, y += a x, f16 rows <-> f32 rows).
 *
 * One branch per path, best first, as in common.h: AVX-512 (16 lanes, the
 * avx512vnni path), AVX2 + FMA (8 lanes, the avxvnni and avx2 paths), plain C
 * (libm's expf and tanhf define the result). RP_VW is the lane count.
 *
 * exp: Cephes' expf scheme. x = n ln2 + r with n = round(x log2 e) and r in
 * [-ln2/2, ln2/2] (ln2 split in two constants, Cody-Waite, so r is exact to a
 * few ulp), exp(r) by a degree-6 polynomial, times 2^n. Below -87 the result is
 * exactly 0 (so exp(-inf) = 0: masked scores vanish), above 88 it is clamped.
 * About 2 ulp against expf over the range softmax uses.
 * tanh(x) = 1 - 2 / (exp(2x) + 1), x clamped to [-9, 9] (tanh(9) rounds to 1):
 * absolute error ~1e-7, which is what soft capping and GELU need.
 * gelu_tanh(g) = g/2 (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), computed as
 * g / (1 + exp(-2 sqrt(2/pi) (g + 0.044715 g^3))): the same value without the
 * cancellation of 1 + tanh(z) near -1 (for g below about -3 that sum loses most
 * of its digits).
 */
#pragma once
#include <math.h>

#include "common.h"

#if defined(RP_AVX512VNNI)
#define RP_VW 16
#elif defined(RP_AVX2)
#define RP_VW 8
#else
#define RP_VW 1
#endif

#define RP_EXP_LO -87.0f
#define RP_EXP_HI 88.0f
#define RP_LOG2E 1.44269504088896341f
#define RP_LN2_HI 0.693359375f
#define RP_LN2_LO -2.12194440e-4f
#define RP_SQRT_2_OVER_PI 0.7978845608028654f

static inline float rp_gelu1(float g) { return g / (1.0f + expf(-2.0f * RP_SQRT_2_OVER_PI * (g + 0.044715f * g * g * g))); }

#if defined(RP_AVX512VNNI)
static inline __m512 rp_exp16(__m512 x) {
    __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(RP_EXP_LO), _CMP_GE_OQ); /* else exactly 0 */
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(RP_EXP_LO)), _mm512_set1_ps(RP_EXP_HI));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(RP_LOG2E)), _MM_FROUND_TO_NEAREST_INT);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(RP_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(RP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_mov_ps(live, _mm512_scalef_ps(p, n));
}

static inline __m512 rp_tanh16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-9.0f)), _mm512_set1_ps(9.0f));
    __m512 e = rp_exp16(_mm512_add_ps(x, x));
    return _mm512_sub_ps(_mm512_set1_ps(1.0f), _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
}

static inline __m512 rp_gelu16(__m512 g) {
    __m512 g3 = _mm512_mul_ps(_mm512_mul_ps(g, g), g);
    __m512 inner = _mm512_mul_ps(_mm512_set1_ps(RP_SQRT_2_OVER_PI), _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), g3, g));
    __m512 den = _mm512_add_ps(_mm512_set1_ps(1.0f), rp_exp16(_mm512_mul_ps(_mm512_set1_ps(-2.0f), inner)));
    return _mm512_div_ps(g, den);
}

static inline __mmask16 rp_tail16(int n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1); }
#endif

#if defined(RP_AVX2)
static inline __m256 rp_exp8(__m256 x) {
    __m256 dead = _mm256_cmp_ps(x, _mm256_set1_ps(RP_EXP_LO), _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(RP_EXP_LO)), _mm256_set1_ps(RP_EXP_HI));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(RP_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(RP_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(RP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^n through the exponent field: n is in [-126, 127] after the clamp */
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(dead, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

static inline __m256 rp_tanh8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-9.0f)), _mm256_set1_ps(9.0f));
    __m256 e = rp_exp8(_mm256_add_ps(x, x));
    return _mm256_sub_ps(_mm256_set1_ps(1.0f), _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
}

static inline __m256 rp_gelu8(__m256 g) {
    __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
    __m256 inner = _mm256_mul_ps(_mm256_set1_ps(RP_SQRT_2_OVER_PI), _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), g3, g));
    __m256 den = _mm256_add_ps(_mm256_set1_ps(1.0f), rp_exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), inner)));
    return _mm256_div_ps(g, den);
}

static inline float rp_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

/* sum_i a[i] b[i] */
static inline float rp_dot(const float *a, const float *b, int n) {
    int i = 0;
    float s = 0.0f;
#if defined(RP_AVX512VNNI)
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
    }
    for (; i < n; i += 16) {
        __mmask16 m = rp_tail16(n - i);
        acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#elif defined(RP_AVX2)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    s = rp_hsum8(_mm256_add_ps(acc0, acc1));
#endif
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* y[i] += a x[i] */
static inline void rp_axpy(float *y, float a, const float *x, int n) {
    int i = 0;
#if defined(RP_AVX512VNNI)
    __m512 va = _mm512_set1_ps(a);
    for (; i < n; i += 16) {
        __mmask16 m = rp_tail16(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
#elif defined(RP_AVX2)
    __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
    for (; i < n; i++) y[i] += a * x[i];
}

/* dst[i] = f32(src[i]) for IEEE half src (F16C: vcvtph2ps) */
static inline void rp_f16_row_to_f32(float *dst, const uint16_t *src, int n) {
    int i = 0;
#if defined(RP_AVX512VNNI)
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
#elif defined(RP_AVX2)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
#endif
    for (; i < n; i++) dst[i] = rp_f16_to_f32(src[i]);
}

/* dst[i] = f16(src[i]), round to nearest even */
static inline void rp_f32_row_to_f16(uint16_t *dst, const float *src, int n) {
    int i = 0;
#if defined(RP_AVX512VNNI)
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(RP_AVX2)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    for (; i < n; i++) dst[i] = rp_f32_to_f16(src[i]);
}

/* x[0 .. n) replaced by its softmax, in place: exp(x - max(x)) / sum(exp(x - max(x))) */
static inline void rp_softmax(float *x, int64_t n) {
    float m = -INFINITY, sum = 0.0f;
    int64_t i = 0;
#if defined(RP_AVX512VNNI)
    __m512 mv = _mm512_set1_ps(-INFINITY), sv = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(x + i));
    m = _mm512_reduce_max_ps(mv);
    for (; i < n; i++) m = fmaxf(m, x[i]);
    const __m512 m16 = _mm512_set1_ps(m);
    for (i = 0; i + 16 <= n; i += 16) {
        __m512 e = rp_exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), m16));
        _mm512_storeu_ps(x + i, e);
        sv = _mm512_add_ps(sv, e);
    }
    sum = _mm512_reduce_add_ps(sv);
#elif defined(RP_AVX2)
    __m256 mv = _mm256_set1_ps(-INFINITY), sv = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
    float lanes[8];
    _mm256_storeu_ps(lanes, mv);
    for (int j = 0; j < 8; j++) m = fmaxf(m, lanes[j]);
    for (; i < n; i++) m = fmaxf(m, x[i]);
    const __m256 m8 = _mm256_set1_ps(m);
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 e = rp_exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), m8));
        _mm256_storeu_ps(x + i, e);
        sv = _mm256_add_ps(sv, e);
    }
    sum = rp_hsum8(sv);
#else
    for (; i < n; i++) m = fmaxf(m, x[i]);
    i = 0;
#endif
    for (; i < n; i++) {
        x[i] = expf(x[i] - m);
        sum += x[i];
    }
    const float inv = 1.0f / sum;
    for (i = 0; i < n; i++) x[i] *= inv;
}

/* Threads worth waking for `rows` rows of `row_elems` floats each: at least 16K
 * elements (64 KB) a thread, below which the hand-over costs more than it saves. */
static inline int rp_row_threads(int64_t rows, int64_t row_elems, int nthreads) {
    int64_t by_work = rows * row_elems / 16384;
    int64_t n = nthreads < by_work ? nthreads : by_work;
    n = n < rows ? n : rows;
    return n < 1 ? 1 : (int)n;
}
