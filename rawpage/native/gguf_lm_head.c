/* The LM head on Q8_0 blocks with exact (float) activations:  y = x W^T.
 *
 *   y  (T, N) float32          logits: N = vocabulary rows
 *   x  (T, K) float32          final hidden states, K a multiple of 32
 *   W  (N, K) Q8_0 blocks as stored in the .gguf file (34 bytes a block:
 *      f16 d, int8 qs[32]; value i = d qs[i]); a tied embedding's table is the same
 *
 * Why not the int8 kernel (gguf_matmul.c): its activations are rounded to int8 per 32
 * values, and at the LM head that rounding lands in the logits directly. On the default
 * model it moved them by up to 0.3 and flipped greedy near-ties (the first token of
 * "What is the capital of France?" became "L'" for "The"). Here each block is widened
 * to float once and multiplied by x as it is: the same bytes read (the LM head is
 * memory-bound at decode: 30 MB of blocks for SmolLM2), 2 FMAs a value instead of a
 * quarter of a vpdpbusd.
 *
 *   y[t, n] = sum_b d[n, b] * sum_i qs[n, b, i] x[t, 32 b + i]
 *
 * A row's blocks are read once per tile of up to 4 tokens: each block's qs are widened
 * to float once for all of them. AVX-512 applies d to each block's dot product
 * (acc += d (qs . x), 3 multiplies a block at T = 1: see row_tokens_n); the AVX2 and
 * plain-C paths multiply by wq = d float(qs) first. Rows of W are split over the
 * threads (16 rows a part).
 */
#include "common.h"

typedef struct {
    uint16_t d;
    int8_t qs[32];
} block_q8_0;

_Static_assert(sizeof(block_q8_0) == 34, "Q8_0 block");

typedef struct {
    float *y;
    const float *x;
    const block_q8_0 *w;
    int64_t T, N, K;
} lm_head_args;

#if defined(RP_AVX512VNNI)
/* y[t0 .. t0 + NT, n] for one row n (NT a compile-time constant, so the NT
 * accumulators stay in registers). Per block and token, the scale is applied once to
 * the block's dot product:
 *     acc += d (qs[0:16] x[0:16] + qs[16:32] x[16:32])       (16 lanes, fmadd(d, ., acc))
 * 3 multiplies on the FMA pipes a block at T = 1 instead of 4 (d qs, d qs, 2 FMAs),
 * which bound one thread: 49152 x 576 on one thread of the development VM went from
 * 23 to 29 GB/s of blocks (a plain read of the table: ~43). The order is the same for
 * every NT, so a token's logits have the same bits alone or in a batch, on any
 * thread count. One row at a time: 2 or 4 rows side by side (to overlap their FMA
 * chains) read as many streams 612 bytes apart and ran 2-3x slower here, prefetch
 * or not; out-of-order execution already overlaps one row's chain with the next. */
static inline __attribute__((always_inline)) void row_tokens_n(const lm_head_args *a, int64_t n, int64_t t0, const int NT) {
    const int64_t nb = a->K / 32;
    const block_q8_0 *row = a->w + n * nb;
    const float *x = a->x + t0 * a->K;
    __m512 acc[4];
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16((short)row[b].d));
        const __m512 q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)row[b].qs)));
        const __m512 q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row[b].qs + 16))));
        for (int t = 0; t < NT; t++) {
            const float *xt = x + t * a->K + 32 * b;
            const __m512 dot = _mm512_fmadd_ps(q1, _mm512_loadu_ps(xt + 16), _mm512_mul_ps(q0, _mm512_loadu_ps(xt)));
            acc[t] = _mm512_fmadd_ps(d, dot, acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) a->y[(t0 + t) * a->N + n] = _mm512_reduce_add_ps(acc[t]);
}

/* Rows [n0, n1) for tokens t0 .. t0 + nt (1-4). */
static void rows_range(const lm_head_args *a, int64_t n0, int64_t n1, int64_t t0, int nt) {
    switch (nt) {
    case 1: for (int64_t n = n0; n < n1; n++) row_tokens_n(a, n, t0, 1); break;
    case 2: for (int64_t n = n0; n < n1; n++) row_tokens_n(a, n, t0, 2); break;
    case 3: for (int64_t n = n0; n < n1; n++) row_tokens_n(a, n, t0, 3); break;
    default: for (int64_t n = n0; n < n1; n++) row_tokens_n(a, n, t0, 4); break;
    }
}
#else
/* y[t0 .. t0 + nt, n] for one row n, nt <= 4 tokens. */
static void row_tokens(const lm_head_args *a, int64_t n, int64_t t0, int nt) {
    const int64_t nb = a->K / 32;
    const block_q8_0 *row = a->w + n * nb;
    const float *x = a->x + t0 * a->K;
#if defined(RP_AVX2)
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < nb; b++) {
        const __m256 d = _mm256_set1_ps(rp_f16_to_f32(row[b].d));
        for (int h = 0; h < 4; h++) { /* 8 values at a time */
            const __m128i q = _mm_loadl_epi64((const __m128i *)(row[b].qs + 8 * h));
            const __m256 w = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
            for (int t = 0; t < nt; t++)
                acc[t] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + t * a->K + 32 * b + 8 * h), acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) {
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[t]), _mm256_extractf128_ps(acc[t], 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_movehdup_ps(s));
        a->y[(t0 + t) * a->N + n] = _mm_cvtss_f32(s);
    }
#else
    float acc[4] = {0, 0, 0, 0};
    for (int64_t b = 0; b < nb; b++) {
        const float d = rp_f16_to_f32(row[b].d);
        for (int t = 0; t < nt; t++) {
            const float *xt = x + t * a->K + 32 * b;
            float s = 0;
            for (int i = 0; i < 32; i++) s += (float)row[b].qs[i] * xt[i];
            acc[t] += d * s;
        }
    }
    for (int t = 0; t < nt; t++) a->y[(t0 + t) * a->N + n] = acc[t];
#endif
}

/* Rows [n0, n1) for tokens t0 .. t0 + nt, one row at a time. */
static void rows_range(const lm_head_args *a, int64_t n0, int64_t n1, int64_t t0, int nt) {
    for (int64_t n = n0; n < n1; n++) row_tokens(a, n, t0, nt);
}
#endif

static void lm_head_part(void *p, int ith, int nth) {
    const lm_head_args *a = p;
    int64_t n0, n1;
    rp_split(a->N, 16, ith, nth, &n0, &n1);
    for (int64_t t0 = 0; t0 < a->T; t0 += 4) {
        const int nt = a->T - t0 < 4 ? (int)(a->T - t0) : 4;
        rows_range(a, n0, n1, t0, nt);
    }
}

/* Returns 0, or 1 if K is not a multiple of 32. */
RP_EXPORT int rp_lm_head_q8_0(float *y, const float *x, const uint8_t *w, int64_t T, int64_t N, int64_t K,
                              int nthreads) {
    if (K % 32) return 1;
    lm_head_args a = {y, x, (const block_q8_0 *)w, T, N, K};
    rp_parallel(lm_head_part, &a, nthreads);
    return 0;
}
