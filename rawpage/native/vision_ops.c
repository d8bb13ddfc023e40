/* The element-wise ops of a vision tower (models/siglip.py, models/qwen_vit.py): between its GEMMs,
 * which linear runs, a SigLIP layer adds the residual and normalizes, activates and
 * takes softmaxes over every patch of the image (4096 rows at 896 px, patch 14).
 *
 *     fused_add_layer_norm : s = x + residual;
 *                            normed = (s - mean(s)) / sqrt(var(s) + eps) w + b     per row
 *                            (mean and var over the row's n elements, var the biased one)
 *     gelu_tanh            : out = gelu_tanh(x)
 *                            (vec_math.h's gelu: g / (1 + exp(-2 sqrt(2/pi) (g + 0.044715 g^3))))
 *     gelu_erf             : out = x Phi(x) = x/2 (1 + erf(x / sqrt(2)))      (Qwen2.5-VL's merger)
 *                            (libm's erff, scalar: the merger runs it once an image, on S/4 rows)
 *     softmax_rows         : x = exp(x - max(x)) / sum(exp(x - max(x)))          per row, in place
 *
 * Layouts: x is [T, stride] float32, row t at x + t stride, its n elements
 * contiguous; outputs are contiguous [T, n]; w and b are [n]. softmax_rows takes the
 * attention scores of a block of one head's queries, a row per query, each row its
 * scores against every key (ops/paged_attention.py's encoder_attention_ref).
 *
 * Work split: rows in equal contiguous parts over the pool, on as many threads as
 * have 16K elements each (rp_row_threads). Each row is one thread's, so the result
 * does not depend on the thread count.
 */
#include <math.h>

#include "common.h"
#include "vec_math.h"

typedef struct vision_rows {
    float *out, *sum;
    const float *x, *residual, *w, *b;
    int64_t x_stride, residual_stride, T, n;
    float eps;
    void (*row)(const struct vision_rows *a, int64_t t); /* the op on row t */
} vision_rows;

/* every op: its rows split over the pool, a->row on each */
static void rows_task(void *arg, int ith, int nth) {
    const vision_rows *a = arg;
    int64_t begin, end;
    rp_split(a->T, 1, ith, nth, &begin, &end);
    for (int64_t t = begin; t < end; t++) a->row(a, t);
}

static void fused_add_layer_norm_row(const vision_rows *a, int64_t t) {
    const int64_t n = a->n;
    const float *x = a->x + t * a->x_stride, *r = a->residual + t * a->residual_stride;
    float *s = a->sum + t * n, *o = a->out + t * n;
    double total = 0.0; /* the mean in double: rows of thousands of near-equal values */
    for (int64_t i = 0; i < n; i++) { /* element i is read before it is written */
        s[i] = x[i] + r[i];
        total += s[i];
    }
    const float mean = (float)(total / (double)n);
    for (int64_t i = 0; i < n; i++) o[i] = s[i] - mean;
    const float inv = 1.0f / sqrtf(rp_dot(o, o, (int)n) / (float)n + a->eps);
    for (int64_t i = 0; i < n; i++) o[i] = o[i] * inv * a->w[i] + a->b[i];
}

/* normed [T, n] = layer_norm(sum), sum [T, n] = x + residual. sum may be the residual's
 * memory and normed x's (each element is read before either is written). */
RP_EXPORT void rp_fused_add_layer_norm(float *normed, float *sum, const float *x, int64_t x_stride,
                                       const float *residual, int64_t residual_stride, const float *weight,
                                       const float *bias, int64_t T, int64_t n, float eps, int nthreads) {
    vision_rows a = {normed, sum, x, residual, weight, bias, x_stride, residual_stride, T, n, eps,
                     fused_add_layer_norm_row};
    rp_parallel(rows_task, &a, rp_row_threads(T, n, nthreads));
}

static void gelu_row(const vision_rows *a, int64_t t) {
    const int64_t n = a->n;
    const float *x = a->x + t * a->x_stride;
    float *o = a->out + t * n;
    int64_t i = 0;
#if defined(RP_AVX512VNNI)
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(o + i, rp_gelu16(_mm512_loadu_ps(x + i)));
#elif defined(RP_AVX2)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(o + i, rp_gelu8(_mm256_loadu_ps(x + i)));
#endif
    for (; i < n; i++) o[i] = rp_gelu1(x[i]);
}

/* out [T, n] = gelu_tanh(x [T, x_stride]); out may be x's memory when x is contiguous */
RP_EXPORT void rp_gelu_tanh(float *out, const float *x, int64_t x_stride, int64_t T, int64_t n, int nthreads) {
    vision_rows a = {out, NULL, x, NULL, NULL, NULL, x_stride, 0, T, n, 0.0f, gelu_row};
    rp_parallel(rows_task, &a, rp_row_threads(T, n, nthreads));
}

static void gelu_erf_row(const vision_rows *a, int64_t t) {
    const float *x = a->x + t * a->x_stride;
    float *o = a->out + t * a->n;
    for (int64_t i = 0; i < a->n; i++) o[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

/* out [T, n] = gelu_erf(x [T, x_stride]) */
RP_EXPORT void rp_gelu_erf(float *out, const float *x, int64_t x_stride, int64_t T, int64_t n, int nthreads) {
    vision_rows a = {out, NULL, x, NULL, NULL, NULL, x_stride, 0, T, n, 0.0f, gelu_erf_row};
    rp_parallel(rows_task, &a, rp_row_threads(T, n, nthreads));
}

static void softmax_row(const vision_rows *a, int64_t t) { rp_softmax(a->out + t * a->x_stride, a->n); }

/* x [T, x_stride]: each row's n elements replaced by their softmax, in place */
RP_EXPORT void rp_softmax_rows(float *x, int64_t x_stride, int64_t T, int64_t n, int nthreads) {
    vision_rows a = {x, NULL, x, NULL, NULL, NULL, x_stride, 0, T, n, 0.0f, softmax_row};
    rp_parallel(rows_task, &a, rp_row_threads(T, n, nthreads));
}
