/* A vision tower in bfloat16 on the CPU: a register-blocked GEMM on weights packed once
 * into panels, and the tower's attention built from the same micro-kernel. On AVX512-BF16
 * (vdpbf16ps: two bf16 products per float32 lane and instruction) it runs at twice the
 * float32 FMA rate; models/siglip.py and models/qwen_vit.py reach it through the CPU
 * backend's encoder linear and encoder_attention where the CPU has the instruction.
 *
 * The math (reference: rawpage/ops/bf16_linear.py bf16_gemm_ref):
 *
 *     y[t, n] = bias[n] + sum_k bf16(x[t, k]) bf16(W[n, k])
 *
 * bf16() rounds to nearest even. A product of two bf16 values is exact in float32, so the
 * only other rounding is the float32 sum: one chain per output, over k in order, two k a
 * step (vdpbf16ps adds k = 2j + 1's product, then k = 2j's), the bias first. The chain
 * does not depend on T, on the tile an output falls in or on the thread count, so a row
 * of y is the same bits in any batch (tests/native/test_bf16_gemm.py proves it).
 *
 * Layouts.
 *   panels  (ceil(N/16), ceil(K/2), 16, 2) uint16 bf16 bits: panel p holds rows 16p ..
 *           16p + 15 of W; for each pair of columns k = 2j, 2j + 1 its 16 rows' two values
 *           side by side, one zmm of 32 values. Rows past N and the column past an odd K
 *           are zero. rp_bf16_pack writes it from float32 (any strides).
 *   x       (T, x_stride) float32, rounded once a call into tiles of MT = 12 rows,
 *           (ceil(T/12), ceil(K/2), 12) uint32: for each pair j of k the 12 rows' pairs
 *           side by side (bf16 k = 2j in the low half), so a micro-tile's broadcasts all
 *           come from one pointer at fixed offsets (no register per row)
 *   y       (T, y_stride) float32
 *
 * Work split. The micro-kernel keeps a tile of 12 rows of x by 2 panels (32 outputs) in
 * 24 zmm accumulators; each pair of k loads the 2 panel vectors once and broadcasts one
 * x pair (a dword, from memory) per row: 24 vdpbf16ps to 14 loads. K goes in blocks of KC
 * pairs, so the two panels' block (2 x KC x 64 B = 16 KB) stays in L1 while every row
 * tile goes by; each tile is ~3000 instructions of compute against 6 KB of x, which any
 * cache level feeds. Threads take pairs of panels (rows of W), rp_split.
 *
 * Attention, rp_bf16_encoder_attention (reference: rawpage/ops/paged_attention.py
 * encoder_attention_bf16_ref): per sequence and head, on one thread each,
 *
 *     S = bf16(scale q) bf16(k)^T          (the GEMM: q's rows as x, k's rows as panels)
 *     P = bf16(softmax(S)), row by row     (float32 softmax, vec_math.h, then rounded)
 *     O = P bf16(v)                         (the GEMM: P as x, v^T as panels)
 *
 * in blocks of QB query rows, so a block's scores (QB x n float32, 384 KB for 4096 keys)
 * stay in L2 between the two products. The keys and values are packed once per sequence
 * and head (~1.2 MB at 4096 x 72). Work items (sequence, head) go round the threads, each
 * with its own scratch.
 *
 * Without AVX512-BF16 the same chains run in plain C (the tests' other paths); the
 * backend takes this kernel only where the CPU has the instruction.
 */
#include <math.h>
#include <stdlib.h>

#include "common.h"
#include "vec_math.h"

#define RP_INLINE static inline __attribute__((always_inline))
#define MT 12  /* rows of x in a micro-tile */
#define KC 128 /* pairs of k in a block */
#define MB 96  /* rows of x a block of K goes through before the next (8 tiles) */
#define QB 24  /* attention: query rows in a block */

#if defined(RP_AVX512VNNI) && defined(__AVX512BF16__)
#define RP_BF16DP 1
#endif

/* float32 -> bf16 bits, round to nearest even (NaN stays NaN): rawpage/dtypes.py bf16_from_f32 */
RP_INLINE uint16_t to_bf16(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    if ((b & 0x7fffffff) > 0x7f800000) return (uint16_t)((b >> 16) | 0x40);
    return (uint16_t)((b + 0x7fff + ((b >> 16) & 1)) >> 16);
}

RP_INLINE float from_bf16(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

typedef struct {
    float *y;
    int64_t ys;
    const uint32_t *x; /* tiles of rounded x */
    const uint16_t *w; /* panels */
    const float *bias;
    int64_t T, N, K;
} gemm_args;

#if !defined(RP_BF16DP)
/* micro's chains in plain C, lane by lane: the 16 lanes of a panel vector, the odd k then
 * the even. Out of GCC's loop vectorizer: GCC 12.2 at -O3 (-march=x86-64-v3 and up)
 * vectorizes this loop nest wrongly, taking an even k's product from the next pair's x
 * (reproduced in 15 lines; -fno-tree-loop-vectorize gives the right sums). */
__attribute__((optimize("no-tree-loop-vectorize"))) static void micro_c(const gemm_args *a, int64_t t0, int64_t p,
                                                                        int64_t j0, int64_t j1, int R, int NP) {
    const int64_t Kh = (a->K + 1) / 2, n0 = p * 16;
    const uint16_t *w = a->w + p * Kh * 32;
    float acc[MT][32];
    for (int t = 0; t < R; t++)
        for (int i = 0; i < 16 * NP; i++)
            acc[t][i] = n0 + i >= a->N ? 0.0f
                        : j0           ? a->y[(t0 + t) * a->ys + n0 + i]
                        : a->bias      ? a->bias[n0 + i]
                                       : 0.0f;
    for (int64_t j = j0; j < j1; j++)
        for (int t = 0; t < R; t++) {
            const uint32_t pair = a->x[(t0 / MT * Kh + j) * MT + t];
            const float odd = from_bf16((uint16_t)(pair >> 16)), even = from_bf16((uint16_t)pair);
            for (int c = 0; c < NP; c++)
                for (int i = 0; i < 16; i++) {
                    const uint16_t *wv = w + (c * Kh + j) * 32 + 2 * i;
                    acc[t][16 * c + i] += odd * from_bf16(wv[1]);
                    acc[t][16 * c + i] += even * from_bf16(wv[0]);
                }
        }
    for (int t = 0; t < R; t++)
        for (int i = 0; i < 16 * NP && n0 + i < a->N; i++) a->y[(t0 + t) * a->ys + n0 + i] = acc[t][i];
}
#endif

/* y[t0 .. t0 + R, panels p .. p + NP) over the pairs j0 .. j1 of k; R <= MT, NP <= 2 are
 * constants at each call, so the loops unroll into registers. j0 = 0 starts from the bias
 * (or 0), a later block from the partial sums in y. */
RP_INLINE void micro(const gemm_args *a, int64_t t0, int64_t p, int64_t j0, int64_t j1, const int R, const int NP) {
#if defined(RP_BF16DP)
    const int64_t Kh = (a->K + 1) / 2, n0 = p * 16;
    const uint16_t *w = a->w + p * Kh * 32;
    __m512 acc[MT][2];
    __mmask16 m[2];
    for (int c = 0; c < NP; c++) m[c] = rp_tail16((int)(a->N - n0 - 16 * c));
    for (int t = 0; t < R; t++)
        for (int c = 0; c < NP; c++)
            acc[t][c] = j0 ? _mm512_maskz_loadu_ps(m[c], a->y + (t0 + t) * a->ys + n0 + 16 * c)
                           : (a->bias ? _mm512_maskz_loadu_ps(m[c], a->bias + n0 + 16 * c) : _mm512_setzero_ps());
    const int32_t *x = (const int32_t *)a->x + t0 / MT * Kh * MT;
    const uint16_t *w1 = w + Kh * 32;
    for (int64_t j = j0; j < j1; j++) {
        __m512bh wv[2];
        wv[0] = (__m512bh)_mm512_loadu_si512(w + j * 32);
        if (NP > 1) wv[1] = (__m512bh)_mm512_loadu_si512(w1 + j * 32);
        for (int t = 0; t < R; t++) {
            const __m512bh xb = (__m512bh)_mm512_set1_epi32(x[j * MT + t]);
            for (int c = 0; c < NP; c++) acc[t][c] = _mm512_dpbf16_ps(acc[t][c], wv[c], xb);
        }
    }
    for (int t = 0; t < R; t++)
        for (int c = 0; c < NP; c++) _mm512_mask_storeu_ps(a->y + (t0 + t) * a->ys + n0 + 16 * c, m[c], acc[t][c]);
#else
    micro_c(a, t0, p, j0, j1, R, NP);
#endif
}

#define MICRO_CASE(R) \
    case R: \
        if (np == 2) \
            micro(a, t0, p, j0, j1, R, 2); \
        else \
            micro(a, t0, p, j0, j1, R, 1); \
        break;

static void micro_any(const gemm_args *a, int64_t t0, int64_t p, int64_t j0, int64_t j1, int rows, int np) {
    switch (rows) {
        MICRO_CASE(1) MICRO_CASE(2) MICRO_CASE(3) MICRO_CASE(4) MICRO_CASE(5) MICRO_CASE(6)
        MICRO_CASE(7) MICRO_CASE(8) MICRO_CASE(9) MICRO_CASE(10) MICRO_CASE(11) MICRO_CASE(12)
    }
}

/* y's columns of panels p0 .. p1 (p0 even), every row: for each block of K, MB rows of x
 * at a time (their tiles, MB x KC x 4 B = 48 KB, in L2) against every pair of panels */
static void gemm_panels(const gemm_args *a, int64_t p0, int64_t p1) {
    const int64_t Kh = (a->K + 1) / 2;
    for (int64_t j0 = 0; j0 < Kh; j0 += KC)
        for (int64_t b = 0; b < a->T; b += MB)
            for (int64_t p = p0; p < p1; p += 2)
                for (int64_t t0 = b; t0 < a->T && t0 < b + MB; t0 += MT)
                    micro_any(a, t0, p, j0, j0 + KC < Kh ? j0 + KC : Kh, (int)(a->T - t0 < MT ? a->T - t0 : MT),
                              p + 1 < p1 ? 2 : 1);
}

static void gemm_task(void *arg, int ith, int nth) {
    const gemm_args *a = arg;
    int64_t p0, p1;
    rp_split((a->N + 15) / 16, 2, ith, nth, &p0, &p1);
    gemm_panels(a, p0, p1);
}

/* --- packing and rounding ------------------------------------------------------------ */

/* panels of W (N, K), element (n, k) at src[n sn + k sk], rows n0 .. n1 (multiples of 16) */
static void pack_rows(uint16_t *panels, const float *src, int64_t sn, int64_t sk, int64_t N, int64_t K, int64_t n0,
                      int64_t n1) {
    const int64_t Kh = (K + 1) / 2;
    for (int64_t n = n0; n < n1; n++) {
        uint16_t *dst = panels + (n / 16) * Kh * 32 + (n % 16) * 2;
        for (int64_t k = 0; k < 2 * Kh; k++)
            dst[(k / 2) * 32 + (k % 2)] = n < N && k < K ? to_bf16(src[n * sn + k * sk]) : 0;
    }
}

typedef struct {
    uint16_t *panels;
    const float *src;
    int64_t sn, sk, N, K;
} pack_args;

static void pack_task(void *arg, int ith, int nth) {
    const pack_args *a = arg;
    int64_t n0, n1;
    rp_split((a->N + 15) / 16 * 16, 16, ith, nth, &n0, &n1);
    pack_rows(a->panels, a->src, a->sn, a->sk, a->N, a->K, n0, n1);
}

/* panels (ceil(N/16) 16 ceil(K/2) 2 uint16) from W (N, K) float32, element (n, k) at w[n sn + k sk] */
RP_EXPORT void rp_bf16_pack(uint16_t *panels, const float *w, int64_t sn, int64_t sk, int64_t N, int64_t K,
                            int nthreads) {
    pack_args a = {panels, w, sn, sk, N, K};
    rp_parallel(pack_task, &a, nthreads);
}

/* row t of x (K floats at src), times scale and rounded, into the tiles of xp (see the
 * header): pair j at xp[(t / MT Kh + j) MT + t % MT], the pad past an odd K zero */
static void pack_x_row(uint32_t *xp, int64_t Kh, int64_t t, const float *src, int64_t K, float scale) {
    uint32_t *dst = xp + t / MT * Kh * MT + t % MT;
    int64_t j = 0;
#if defined(RP_BF16DP)
    const __m512 s = _mm512_set1_ps(scale);
    for (; 2 * j + 32 <= K; j += 16) { /* vcvtne2ps2bf16 rounds to nearest even too */
        uint32_t pairs[16];
        const __m512 lo = _mm512_mul_ps(s, _mm512_loadu_ps(src + 2 * j)), hi = _mm512_mul_ps(s, _mm512_loadu_ps(src + 2 * j + 16));
        _mm512_storeu_si512(pairs, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        for (int i = 0; i < 16; i++) dst[(j + i) * MT] = pairs[i];
    }
#endif
    for (; j < Kh; j++) {
        const uint32_t even = to_bf16(scale * src[2 * j]), odd = 2 * j + 1 < K ? to_bf16(scale * src[2 * j + 1]) : 0;
        dst[j * MT] = even | odd << 16;
    }
}

typedef struct {
    uint32_t *xp;
    const float *x;
    int64_t x_stride, T, K;
} pack_x_args;

static void pack_x_task(void *arg, int ith, int nth) {
    const pack_x_args *a = arg;
    int64_t t0, t1;
    rp_split(a->T, MT, ith, nth, &t0, &t1); /* whole tiles: each tile's words one thread's */
    for (int64_t t = t0; t < t1; t++) pack_x_row(a->xp, (a->K + 1) / 2, t, a->x + t * a->x_stride, a->K, 1.0f);
}

/* y (T, y_stride) = bf16(x) W^T + bias, x (T, x_stride) float32, W in panels (N, K); see
 * the header. Returns 0, or -1 if x's tiles could not be allocated. */
RP_EXPORT int rp_bf16_gemm(float *y, int64_t y_stride, const float *x, int64_t x_stride, const uint16_t *panels,
                           const float *bias, int64_t T, int64_t N, int64_t K, int nthreads) {
    uint32_t *xp = malloc((size_t)((T + MT - 1) / MT * MT * ((K + 1) / 2) * 4));
    if (!xp) return -1;
    pack_x_args px = {xp, x, x_stride, T, K};
    rp_parallel(pack_x_task, &px, rp_row_threads(T, K, nthreads));
    gemm_args a = {y, y_stride, xp, panels, bias, T, N, K};
    const int64_t pairs = (N + 31) / 32;
    rp_parallel(gemm_task, &a, (int)(pairs < nthreads ? pairs : nthreads));
    free(xp);
    return 0;
}

/* --- attention ----------------------------------------------------------------------- */

typedef struct {
    float *out;
    const float *q, *k, *v;
    int64_t row_stride, head_stride;
    const int64_t *bounds;
    int64_t nseq, H, D;
    float scale;
    uint8_t *scratch;
    int64_t scratch_each;
} attn_args;

#define ALIGN64(n) (((n) + 63) / 64 * 64)
#define EVEN(n) (((n) + 1) / 2 * 2)

#define TILES(n) (((n) + MT - 1) / MT * MT)

/* one thread's buffers, in bytes: q's tiles, packed k, packed v^T, a block's scores, its P's tiles */
static int64_t attn_scratch(int64_t n, int64_t D) {
    return ALIGN64(TILES(n) * EVEN(D) * 2) + ALIGN64((n + 15) / 16 * 16 * EVEN(D) * 2) +
           ALIGN64((D + 15) / 16 * 16 * EVEN(n) * 2) + ALIGN64(QB * n * 4) + ALIGN64(QB * EVEN(n) * 2);
}

static void attend(const attn_args *a, int64_t s, int64_t h, uint8_t *mem) {
    const int64_t r0 = a->bounds[s], n = a->bounds[s + 1] - r0, D = a->D, Dh = (D + 1) / 2, nh = (n + 1) / 2;
    if (n <= 0) return;
    uint32_t *qt = (uint32_t *)mem;
    uint16_t *kp = (uint16_t *)(mem += ALIGN64(TILES(n) * EVEN(D) * 2));
    uint16_t *vt = (uint16_t *)(mem += ALIGN64((n + 15) / 16 * 16 * EVEN(D) * 2));
    float *sc = (float *)(mem += ALIGN64((D + 15) / 16 * 16 * EVEN(n) * 2));
    uint32_t *pt = (uint32_t *)(mem += ALIGN64(QB * n * 4));
    const int64_t off = r0 * a->row_stride + h * a->head_stride;
    for (int64_t t = 0; t < n; t++) pack_x_row(qt, Dh, t, a->q + off + t * a->row_stride, D, a->scale);
    pack_rows(kp, a->k + off, a->row_stride, 1, n, D, 0, (n + 15) / 16 * 16);  /* keys as rows */
    pack_rows(vt, a->v + off, 1, a->row_stride, D, n, 0, (D + 15) / 16 * 16); /* v^T: dims as rows */
    for (int64_t b = 0; b < n; b += QB) {
        const int64_t rows = n - b < QB ? n - b : QB;
        const gemm_args scores = {sc, n, qt + b * Dh, kp, NULL, rows, n, D}; /* b: whole tiles */
        gemm_panels(&scores, 0, (n + 15) / 16);
        for (int64_t t = 0; t < rows; t++) {
            rp_softmax(sc + t * n, n);
            pack_x_row(pt, nh, t, sc + t * n, n, 1.0f);
        }
        const gemm_args o = {a->out + ((r0 + b) * a->H + h) * D, a->H * D, pt, vt, NULL, rows, D, n};
        gemm_panels(&o, 0, (D + 15) / 16);
    }
}

static void attn_task(void *arg, int ith, int nth) {
    const attn_args *a = arg;
    uint8_t *mem = a->scratch + ith * a->scratch_each;
    for (int64_t item = ith; item < a->nseq * a->H; item += nth) attend(a, item / a->H, item % a->H, mem);
}

/* out (N, H, D) float32 = each sequence's attention, one head at a time (see the header).
 * q, k, v: element (row r, head h, d) at x[r row_stride + h head_stride + d]; bounds
 * (nseq + 1,) row offsets 0 .. N. Returns 0, or -1 if the scratch could not be allocated. */
RP_EXPORT int rp_bf16_encoder_attention(float *out, const float *q, const float *k, const float *v, int64_t row_stride,
                                        int64_t head_stride, const int64_t *bounds, int64_t nseq, int64_t H,
                                        int64_t D, float scale, int nthreads) {
    int64_t longest = 0;
    for (int64_t s = 0; s < nseq; s++)
        longest = bounds[s + 1] - bounds[s] > longest ? bounds[s + 1] - bounds[s] : longest;
    const int64_t items = nseq * H, nth = items < nthreads ? items : nthreads;
    if (nth < 1) return 0;
    const int64_t each = attn_scratch(longest, D);
    uint8_t *scratch = aligned_alloc(64, (size_t)(each * nth));
    if (!scratch) return -1;
    attn_args a = {out, q, k, v, row_stride, head_stride, bounds, nseq, H, D, scale, scratch, each};
    rp_parallel(attn_task, &a, (int)nth);
    free(scratch);
    return 0;
}
