/* Linear layers on 16-bit float weights, bfloat16 or IEEE half (f16), kept as the
 * checkpoint stores them:  y = x W^T (+ bias).
 *
 *   y     (T, N) float32
 *   x     (T, K) float32
 *   W     (N, K) bfloat16 or half bits (uint16), row n contiguous: a bf16 safetensors
 *         tensor, or a GGUF's BF16 / F16 tensor, as stored
 *   bias  (N,) float32 or NULL
 *
 * The math. bfloat16 is the top half of a float32, so widening a weight is a 16-bit
 * shift and exact:  w = float(bits << 16); a half widens exactly too (vcvtph2ps, F16C).
 * The kernel reads 2 bytes a weight (half of float32's, which is what decode's
 * memory-bound GEMV pays for) and computes
 *
 *     y[t, n] = sum_k float(W[n, k]) x[t, k]          (round_x = 0: what the backend runs)
 *
 * in float32 FMAs: the weights exact, the activations exact, only float32 summation
 * rounding, as a float32 GEMM on the widened weights.
 *
 * round_x = 1 (bf16 weights only) measures the alternative, AVX512-BF16's vdpbf16ps (two bf16 products
 * per float lane and instruction): it takes both operands in bf16, so x is rounded to
 * bf16 (8 significant bits, relative error up to 2^-9) once per call:
 *
 *     y[t, n] = sum_k float(W[n, k]) bf16(x[t, k])
 *
 * Where the CPU has no AVX512-BF16 the same rounded x goes through the FMA kernel, so
 * both variants mean the same on every path. docs/benchmarks.md has the two side by
 * side; the backend takes the exact one (rawpage/native/bf16.py says why).
 *
 * Work split: rows of W over threads (rp_split, 16 rows a part). A thread takes its
 * rows in tiles of 4 rows x 2 tokens, 8 accumulators in registers (8 independent FMA
 * chains): each weight vector is widened once for both tokens, each x vector serves 4
 * rows, and a tile's 4 rows (4 K 2 bytes) stay in L1 while the tokens go by, so W is
 * read from memory once per call. The row tail runs 1 row at a time; K's tail (not a
 * multiple of the vector width) in plain C.
 */
#include "common.h"

#define RP_INLINE static inline __attribute__((always_inline))

typedef struct {
    float *y;
    const float *x; /* (T, K): the caller's x, or its bf16-rounded copy (round_x) */
    const uint16_t *w;
    const float *bias;
    int64_t T, N, K;
    int f16; /* W holds halves, not bfloat16 */
    int dp;  /* vdpbf16ps on bf16 x (xh) instead of FMAs on float x */
    const uint16_t *xh; /* (T, K) bf16 bits of x, for dp */
} half_args;

RP_INLINE float bf16_f32(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* float32 -> bf16 bits, round to nearest even (NaN stays NaN): rawpage/dtypes.py bf16_from_f32. */
RP_INLINE uint16_t f32_bf16(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    if ((b & 0x7fffffff) > 0x7f800000) return (uint16_t)((b >> 16) | 0x40);
    return (uint16_t)((b + 0x7fff + ((b >> 16) & 1)) >> 16);
}

/* y[t0 .. t0 + NT, n0 .. n0 + NR] += the tile's dot products, then bias. NR <= 4, NT <= 2,
 * compile-time constants at every call, so the r and t loops unroll into registers. */
RP_INLINE void tile(const half_args *a, int64_t n0, int64_t t0, const int NR, const int NT) {
    const int64_t K = a->K;
    float s[4][2] = {{0}};
    int64_t k = 0;
#if defined(RP_AVX512VNNI)
    __m512 acc[4][2];
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_ps();
#if defined(__AVX512BF16__)
    if (a->dp) { /* 32 values a step: acc lane i += w[2i] x[2i] + w[2i+1] x[2i+1] */
        for (; k + 32 <= K; k += 32) {
            __m512bh xv[2];
            for (int t = 0; t < NT; t++) xv[t] = (__m512bh)_mm512_loadu_si512(a->xh + (t0 + t) * K + k);
            for (int r = 0; r < NR; r++) {
                const __m512bh wv = (__m512bh)_mm512_loadu_si512(a->w + (n0 + r) * K + k);
                for (int t = 0; t < NT; t++) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv, xv[t]);
            }
        }
    } else
#endif
    { /* 16 values a step: widen W (zero-extend to 32 bits, shift up 16), FMA with x */
        for (; k + 16 <= K; k += 16) {
            __m512 xv[2];
            for (int t = 0; t < NT; t++) xv[t] = _mm512_loadu_ps(a->x + (t0 + t) * K + k);
            for (int r = 0; r < NR; r++) {
                const __m256i h = _mm256_loadu_si256((const __m256i *)(a->w + (n0 + r) * K + k));
                const __m512 wv = a->f16 ? _mm512_cvtph_ps(h) : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
                for (int t = 0; t < NT; t++) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
            }
        }
    }
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++) s[r][t] = _mm512_reduce_add_ps(acc[r][t]);
#elif defined(RP_AVX2)
    __m256 acc[4][2];
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++) acc[r][t] = _mm256_setzero_ps();
    for (; k + 8 <= K; k += 8) {
        __m256 xv[2];
        for (int t = 0; t < NT; t++) xv[t] = _mm256_loadu_ps(a->x + (t0 + t) * K + k);
        for (int r = 0; r < NR; r++) {
            const __m128i h = _mm_loadu_si128((const __m128i *)(a->w + (n0 + r) * K + k));
            const __m256 wv = a->f16 ? _mm256_cvtph_ps(h) : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
            for (int t = 0; t < NT; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++) {
            __m128 v = _mm_add_ps(_mm256_castps256_ps128(acc[r][t]), _mm256_extractf128_ps(acc[r][t], 1));
            v = _mm_add_ps(v, _mm_movehl_ps(v, v));
            v = _mm_add_ss(v, _mm_movehdup_ps(v));
            s[r][t] = _mm_cvtss_f32(v);
        }
#endif
    /* plain C: the whole of K on the scalar path, the tail past the vectors elsewhere */
    for (; k < K; k++)
        for (int r = 0; r < NR; r++) {
            const float w = a->f16 ? rp_f16_to_f32(a->w[(n0 + r) * K + k]) : bf16_f32(a->w[(n0 + r) * K + k]);
            for (int t = 0; t < NT; t++) s[r][t] += w * a->x[(t0 + t) * K + k];
        }
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++)
            a->y[(t0 + t) * a->N + n0 + r] = s[r][t] + (a->bias ? a->bias[n0 + r] : 0.0f);
}

static void matmul_part(void *p, int ith, int nth) {
    const half_args *a = p;
    int64_t n0, n1;
    rp_split(a->N, 16, ith, nth, &n0, &n1);
    int64_t n = n0;
    for (; n + 4 <= n1; n += 4) {
        int64_t t = 0;
        for (; t + 2 <= a->T; t += 2) tile(a, n, t, 4, 2);
        if (t < a->T) tile(a, n, t, 4, 1);
    }
    for (; n < n1; n++) {
        int64_t t = 0;
        for (; t + 2 <= a->T; t += 2) tile(a, n, t, 1, 2);
        if (t < a->T) tile(a, n, t, 1, 1);
    }
}

/* round_x: xr (T, K) float scratch receives bf16(x) as floats (what the dot products
 * read past the vdpbf16ps steps, and on paths without it), xh (T, K) uint16 its bits. */
typedef struct {
    const float *x;
    float *xr;
    uint16_t *xh;
    int64_t n;
} round_args;

static void round_part(void *p, int ith, int nth) {
    const round_args *a = p;
    int64_t i0, i1;
    rp_split(a->n, 64, ith, nth, &i0, &i1);
    for (int64_t i = i0; i < i1; i++) {
        a->xh[i] = f32_bf16(a->x[i]);
        a->xr[i] = bf16_f32(a->xh[i]);
    }
}

/* Returns 0, or -1 for round_x on f16 weights. scratch: round_x only, T K (4 + 2) bytes. */
RP_EXPORT int rp_half_matmul(int f16, float *y, const float *x, const uint16_t *w, const float *bias, int64_t T,
                             int64_t N, int64_t K, int round_x, void *scratch, int nthreads) {
    half_args a = {y, x, w, bias, T, N, K, f16, 0, NULL};
    if (round_x && f16) return -1;
    if (round_x) {
        round_args r = {x, (float *)scratch, (uint16_t *)((float *)scratch + T * K), T * K};
        rp_parallel(round_part, &r, T * K >= (1 << 16) ? nthreads : 1);
        a.x = r.xr;
        a.xh = r.xh;
#if defined(RP_AVX512VNNI) && defined(__AVX512BF16__)
        a.dp = 1;
#endif
    }
    rp_parallel(matmul_part, &a, nthreads);
    return 0;
}

/* --- rows: a 16-bit embedding table -------------------------------------------------- */

typedef struct {
    float *out;         /* [T, n] */
    const uint16_t *w;  /* [V, n] */
    const int32_t *ids; /* [T] */
    int64_t T, n;
    int f16;
} half_rows_args;

static void rows_part(void *p, int ith, int nth) {
    const half_rows_args *a = p;
    int64_t t0, t1;
    rp_split(a->T, 1, ith, nth, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        const uint16_t *row = a->w + (int64_t)a->ids[t] * a->n;
        float *out = a->out + t * a->n;
        for (int64_t k = 0; k < a->n; k++) out[k] = a->f16 ? rp_f16_to_f32(row[k]) : bf16_f32(row[k]);
    }
}

/* out [T, n] = rows ids [T] of table [V, n] widened, exactly (the caller checks every id). */
RP_EXPORT void rp_half_rows(int f16, float *out, const uint16_t *table, const int32_t *ids, int64_t T, int64_t n,
                            int nthreads) {
    half_rows_args a = {out, table, ids, T, n, f16};
    rp_parallel(rows_part, &a, T * n >= (1 << 16) ? nthreads : 1);
}
