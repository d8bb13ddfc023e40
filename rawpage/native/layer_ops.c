/* The small ops of a decoder layer, row by row: RMSNorm (with the residual add),
 * RoPE, the gated activations and the K/V write into the paged cache.
 *
 *     rms_norm(x)          = x / sqrt(mean(x^2) + eps) * w
 *     fused_add_rms_norm   : s = x + residual; normed = rms_norm(s)
 *     rope                 : pairs (a, b) of each head turn by p inv_freq_j:
 *                            a' = a cos - b sin,  b' = b cos + a sin
 *                            NeoX pairs lane j with j + D/2, GPT-J lanes 2j and 2j + 1
 *     silu_and_mul         : g / (1 + exp(-g)) u               on [g | u]
 *     gelu_tanh_and_mul    : g/2 (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) u
 *     write_kv             : cache[slot_mapping[t]] = k[t], v[t]  (-1 = skip)
 *     embedding_rows       : out[t] = table[ids[t]]  (a dense float32 embedding)
 *
 * Layouts: activations are [T, stride] float32, row t at x + t stride, its
 * elements contiguous (a view into the fused qkv output, or a row slice, needs
 * no copy); outputs are contiguous [T, n]. cos_sin is [max_pos, D] float32, row
 * p = [cos(p f_0 .. p f_{D/2-1}) | sin(...)]. The caches are [NB, BS, Hkv, D],
 * float32 (kv_dtype 0) or float16 (1), so slot s is row s of [NB BS, Hkv D].
 *
 * Work split: rows in equal contiguous parts over the pool, on as many threads as
 * have 16K elements each (rp_row_threads): a decode's single row stays on the
 * calling thread.
 */
#include <math.h>

#include "common.h"
#include "vec_math.h"

typedef struct {
    float *out, *out2;      /* [T, n] contiguous: the result (and fused_add_rms_norm's sum) */
    const float *x, *y, *w; /* x [T, x_stride], y (the residual) [T, y_stride], w the weight [n] */
    int64_t x_stride, y_stride, T, n;
    float eps;
} rows_args;

/* out = s inv_rms w, inv_rms = 1 / sqrt(mean(s^2) + eps); out may be s */
static void scale_by_rms(float *out, const float *s, const float *w, int64_t n, float eps) {
    float inv = 1.0f / sqrtf(rp_dot(s, s, (int)n) / (float)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = s[i] * inv * w[i];
}

static void rms_norm_task(void *arg, int ith, int nth) {
    const rows_args *a = arg;
    int64_t b, e;
    rp_split(a->T, 1, ith, nth, &b, &e);
    for (int64_t t = b; t < e; t++) scale_by_rms(a->out + t * a->n, a->x + t * a->x_stride, a->w, a->n, a->eps);
}

/* out [T, n] = rms_norm(x [T, x_stride]) */
RP_EXPORT void rp_rms_norm(float *out, const float *x, int64_t x_stride, const float *weight, int64_t T, int64_t n,
                           float eps, int nthreads) {
    rows_args a = {out, NULL, x, NULL, weight, x_stride, 0, T, n, eps};
    rp_parallel(rms_norm_task, &a, rp_row_threads(T, n, nthreads));
}

static void fused_add_rms_norm_task(void *arg, int ith, int nth) {
    const rows_args *a = arg;
    int64_t b, e;
    rp_split(a->T, 1, ith, nth, &b, &e);
    for (int64_t t = b; t < e; t++) {
        const float *x = a->x + t * a->x_stride, *y = a->y + t * a->y_stride;
        float *s = a->out2 + t * a->n;
        for (int64_t i = 0; i < a->n; i++) s[i] = x[i] + y[i]; /* element i is read before it is written */
        scale_by_rms(a->out + t * a->n, s, a->w, a->n, a->eps);
    }
}

/* normed [T, n] = rms_norm(sum), sum [T, n] = x + residual. sum may be the residual's
 * memory and normed x's (each element is read before either is written). */
RP_EXPORT void rp_fused_add_rms_norm(float *normed, float *sum, const float *x, int64_t x_stride, const float *residual,
                                     int64_t residual_stride, const float *weight, int64_t T, int64_t n, float eps,
                                     int nthreads) {
    rows_args a = {normed, sum, x, residual, weight, x_stride, residual_stride, T, n, eps};
    rp_parallel(fused_add_rms_norm_task, &a, rp_row_threads(T, n, nthreads));
}

/* out [T, I] = f(g) u over x [T, x_stride] = [g (I) | u (I)] */
static void silu_and_mul_task(void *arg, int ith, int nth) {
    const rows_args *a = arg;
    int64_t b, e;
    rp_split(a->T, 1, ith, nth, &b, &e);
    const int64_t I = a->n;
    for (int64_t t = b; t < e; t++) {
        const float *g = a->x + t * a->x_stride, *u = g + I;
        float *o = a->out + t * I;
        int64_t i = 0;
#if defined(RP_AVX512VNNI)
        for (; i + 16 <= I; i += 16) {
            __m512 gv = _mm512_loadu_ps(g + i), den = _mm512_add_ps(_mm512_set1_ps(1.0f), rp_exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv)));
            _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_div_ps(gv, den), _mm512_loadu_ps(u + i)));
        }
#elif defined(RP_AVX2)
        for (; i + 8 <= I; i += 8) {
            __m256 gv = _mm256_loadu_ps(g + i), den = _mm256_add_ps(_mm256_set1_ps(1.0f), rp_exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv)));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_div_ps(gv, den), _mm256_loadu_ps(u + i)));
        }
#endif
        for (; i < I; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i]; /* exp overflow: g / inf = -0, right */
    }
}

/* gelu_tanh(g) u, by vec_math.h's gelu */
static void gelu_tanh_and_mul_task(void *arg, int ith, int nth) {
    const rows_args *a = arg;
    int64_t b, e;
    rp_split(a->T, 1, ith, nth, &b, &e);
    const int64_t I = a->n;
    for (int64_t t = b; t < e; t++) {
        const float *g = a->x + t * a->x_stride, *u = g + I;
        float *o = a->out + t * I;
        int64_t i = 0;
#if defined(RP_AVX512VNNI)
        for (; i + 16 <= I; i += 16) _mm512_storeu_ps(o + i, _mm512_mul_ps(rp_gelu16(_mm512_loadu_ps(g + i)), _mm512_loadu_ps(u + i)));
#elif defined(RP_AVX2)
        for (; i + 8 <= I; i += 8) _mm256_storeu_ps(o + i, _mm256_mul_ps(rp_gelu8(_mm256_loadu_ps(g + i)), _mm256_loadu_ps(u + i)));
#endif
        for (; i < I; i++) o[i] = rp_gelu1(g[i]) * u[i];
    }
}

RP_EXPORT void rp_silu_and_mul(float *out, const float *x, int64_t x_stride, int64_t T, int64_t I, int nthreads) {
    rows_args a = {out, NULL, x, NULL, NULL, x_stride, 0, T, I, 0.0f};
    rp_parallel(silu_and_mul_task, &a, rp_row_threads(T, 2 * I, nthreads));
}

RP_EXPORT void rp_gelu_tanh_and_mul(float *out, const float *x, int64_t x_stride, int64_t T, int64_t I, int nthreads) {
    rows_args a = {out, NULL, x, NULL, NULL, x_stride, 0, T, I, 0.0f};
    rp_parallel(gelu_tanh_and_mul_task, &a, rp_row_threads(T, 2 * I, nthreads));
}

typedef struct {
    const int32_t *positions; /* [T] */
    float *q, *k;             /* [T, q_stride], [T, k_stride]: H and Hkv heads of D */
    const float *cos_sin;     /* [max_pos, D] */
    int64_t q_stride, k_stride, T;
    int H, Hkv, D, is_neox;
} rope_args;

/* Rotate `heads` heads of D at x by one position's cos c and sin s (D/2 each). */
static inline void rotate_heads(float *x, int heads, int D, const float *c, const float *s, int is_neox) {
    const int half = D / 2;
    for (int h = 0; h < heads; h++, x += D) {
        if (is_neox) { /* a = x[j], b = x[j + D/2]: two contiguous halves, vectorized by the compiler */
            float *xa = x, *xb = x + half;
            for (int j = 0; j < half; j++) {
                float a = xa[j], b = xb[j];
                xa[j] = a * c[j] - b * s[j];
                xb[j] = b * c[j] + a * s[j];
            }
        } else { /* a = x[2j], b = x[2j + 1] */
            for (int j = 0; j < half; j++) {
                float a = x[2 * j], b = x[2 * j + 1];
                x[2 * j] = a * c[j] - b * s[j];
                x[2 * j + 1] = b * c[j] + a * s[j];
            }
        }
    }
}

static void rope_task(void *arg, int ith, int nth) {
    const rope_args *a = arg;
    int64_t b, e;
    rp_split(a->T, 1, ith, nth, &b, &e);
    for (int64_t t = b; t < e; t++) {
        const float *c = a->cos_sin + (int64_t)a->positions[t] * a->D, *s = c + a->D / 2;
        rotate_heads(a->q + t * a->q_stride, a->H, a->D, c, s, a->is_neox); /* one cos/sin row for every head */
        rotate_heads(a->k + t * a->k_stride, a->Hkv, a->D, c, s, a->is_neox);
    }
}

/* In place on q [T, q_stride] (H heads of D a row) and k [T, k_stride] (Hkv heads). */
RP_EXPORT void rp_rope(const int32_t *positions, float *q, int64_t q_stride, float *k, int64_t k_stride,
                       const float *cos_sin, int64_t T, int H, int Hkv, int D, int is_neox, int nthreads) {
    rope_args a = {positions, q, k, cos_sin, q_stride, k_stride, T, H, Hkv, D, is_neox};
    rp_parallel(rope_task, &a, rp_row_threads(T, (int64_t)(H + Hkv) * D, nthreads));
}

typedef struct {
    const float *k, *v; /* [T, k_stride], [T, v_stride]: rows of Hkv D */
    void *k_cache, *v_cache;
    const int32_t *slot_mapping; /* [T] */
    int64_t k_stride, v_stride, T, row;
    int kv_dtype;
} write_kv_args;

static void write_kv_task(void *arg, int ith, int nth) {
    const write_kv_args *a = arg;
    int64_t b, e;
    rp_split(a->T, 1, ith, nth, &b, &e);
    for (int64_t t = b; t < e; t++) {
        const int64_t slot = a->slot_mapping[t];
        if (slot < 0) continue; /* a padding token */
        const float *k = a->k + t * a->k_stride, *v = a->v + t * a->v_stride;
        if (a->kv_dtype == 0) {
            memcpy((float *)a->k_cache + slot * a->row, k, sizeof(float) * a->row);
            memcpy((float *)a->v_cache + slot * a->row, v, sizeof(float) * a->row);
        } else {
            rp_f32_row_to_f16((uint16_t *)a->k_cache + slot * a->row, k, (int)a->row);
            rp_f32_row_to_f16((uint16_t *)a->v_cache + slot * a->row, v, (int)a->row);
        }
    }
}

/* k_cache, v_cache [NB BS, row] (row = Hkv D) at slot_mapping's slots = k, v [T, stride] */
RP_EXPORT void rp_write_kv(const float *k, int64_t k_stride, const float *v, int64_t v_stride, void *k_cache,
                           void *v_cache, int kv_dtype, const int32_t *slot_mapping, int64_t T, int64_t row,
                           int nthreads) {
    write_kv_args a = {k, v, k_cache, v_cache, slot_mapping, k_stride, v_stride, T, row, kv_dtype};
    rp_parallel(write_kv_task, &a, rp_row_threads(T, 2 * row, nthreads));
}

typedef struct {
    float *out;          /* [T, n] */
    const float *table;  /* [V, n] */
    const int32_t *ids;  /* [T] */
    int64_t T, n;
} rows_gather_args;

static void embedding_rows_task(void *arg, int ith, int nth) {
    const rows_gather_args *a = arg;
    int64_t b, e;
    rp_split(a->T, 1, ith, nth, &b, &e);
    for (int64_t t = b; t < e; t++) memcpy(a->out + t * a->n, a->table + (int64_t)a->ids[t] * a->n, sizeof(float) * a->n);
}

/* out [T, n] = rows ids [T] of table [V, n] (the caller checks every id is in 0 .. V) */
RP_EXPORT void rp_embedding_rows(float *out, const float *table, const int32_t *ids, int64_t T, int64_t n,
                                 int nthreads) {
    rows_gather_args a = {out, table, ids, T, n};
    rp_parallel(embedding_rows_task, &a, rp_row_threads(T, n, nthreads));
}
