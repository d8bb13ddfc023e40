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
 * Per block, wq = d * float(qs) (32 floats) is made once and used for every token of
 * a tile of 4, so a row's blocks are read once per 4 tokens. Rows of W are split over
 * the threads (16 rows a part).
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

/* y[t0 .. t0 + nt, n] for one row n, nt <= 4 tokens. */
static void row_tokens(const lm_head_args *a, int64_t n, int64_t t0, int nt) {
    const int64_t nb = a->K / 32;
    const block_q8_0 *row = a->w + n * nb;
    const float *x = a->x + t0 * a->K;
#if defined(RP_AVX512VNNI)
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t b = 0; b < nb; b++) {
        const __m512 d = _mm512_set1_ps(rp_f16_to_f32(row[b].d));
        const __m128i q = _mm_loadu_si128((const __m128i *)row[b].qs);
        const __m128i q2 = _mm_loadu_si128((const __m128i *)(row[b].qs + 16));
        const __m512 w0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
        const __m512 w1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q2)));
        for (int t = 0; t < nt; t++) {
            const float *xt = x + t * a->K + 32 * b;
            acc[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xt), acc[t]);
            acc[t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xt + 16), acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) a->y[(t0 + t) * a->N + n] = _mm512_reduce_add_ps(acc[t]);
#elif defined(RP_AVX2)
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

static void lm_head_part(void *p, int ith, int nth) {
    const lm_head_args *a = p;
    int64_t n0, n1;
    rp_split(a->N, 16, ith, nth, &n0, &n1);
    for (int64_t t0 = 0; t0 < a->T; t0 += 4) {
        const int nt = a->T - t0 < 4 ? (int)(a->T - t0) : 4;
        for (int64_t n = n0; n < n1; n++) row_tokens(a, n, t0, nt);
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
