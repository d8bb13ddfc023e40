/* Linear layers on GGUF weights kept in their blocks:  y = x W^T (+ bias).
 *
 *   y     (T, N) float32
 *   x     (T, K) float32, K a multiple of the format's block
 *   W     (N, K) as stored in the .gguf file: row n is row_bytes = K / QK * sizeof(block)
 *
 * The math (ggml-cpu's scheme, and the simulator's MMVQ kernel, cuda/gguf_mmvq.cu):
 *
 * 1. The activation is quantized once per call, per 32-value chunk c of each token
 *    (exactly as rawpage/ops/gguf_mmvq.py quantize_q8_ref does, in float32):
 *        dx[t, c] = max_i |x[t, 32c + i]| / 127,     xq = rint(x / dx)  (0 where dx = 0)
 *        s[t, c]  = dx[t, c] * sum_i xq[t, 32c + i]
 * 2. Every weight format is, per group g of G values (G = 32; 16 for Q6_K), an affine
 *    map of small integers:  W[n, k] = a_g q_k + b_c
 *        Q8_0  q int8             a = d           b = 0
 *        Q4_0  q 0..15            a = d           b = -8 d
 *        Q4_1  q 0..15            a = d           b = m
 *        Q4_K  q 0..15            a = d sc_j      b = -dmin m_j     (chunk j of 8)
 *        Q5_K  q 0..31            as Q4_K
 *        Q6_K  q - 32, -32..31    a = d sc (per 16 values)          b = 0
 *    so one chunk's share of y[t, n] is
 *        sum_k W x  =  sum_g a_g dx_c (sum_{k in g} q_k xq_k)  +  b_c s[t, c]
 *    The inner sums are int8 dot products, exact in int32: vpdpbusd on AVX-512 VNNI
 *    (zmm, two chunks per instruction) or AVX-VNNI (ymm, one chunk), maddubs + madd on
 *    AVX2. Those instructions multiply unsigned by signed bytes: the unsigned formats
 *    pass q as the unsigned side; for the signed ones (Q8_0, Q6_K) the ymm paths take
 *    |q| and xq with q's sign (vpsignb), the zmm path (which has no vpsignb) takes
 *    xq + 128 and subtracts 128 sum q, which it gets from one more vpdpbusd per block
 *    shared by all tokens. Each int32 lane (4 values) is then turned to float and
 *    multiplied by its a_g dx_c; the b_c s terms are a short float dot per row.
 *
 * The blocks (all little-endian; f16 is an IEEE half, see the structs below):
 *
 *   Q8_0   34 B / 32:  d, qs[32]                 value i = d qs[i]
 *   Q4_0   18 B / 32:  d, qs[16]                 qs[i] holds value i (low nibble) and i + 16 (high)
 *   Q4_1   20 B / 32:  d, m, qs[16]              as Q4_0, value = d q + m
 *   Q4_K  144 B / 256: d, dmin, scales[12], qs[128]
 *            8 chunks; chunk j's 6-bit sc_j and m_j are packed in `scales` (k_scale_min);
 *            chunks 2g and 2g + 1 share qs[32g .. 32g + 32): 2g low nibbles, 2g + 1 high.
 *   Q5_K  176 B / 256: d, dmin, scales[12], qh[32], qs[128]
 *            as Q4_K; bit j of qh[l] is bit 4 of value l of chunk j.
 *   Q6_K  210 B / 256: ql[128], qh[64], scales[16] int8, d
 *            half h (values 128h ..) uses ql[64h ..), qh[32h ..), scales[8h ..); its chunk
 *            r takes nibble r / 2 of ql[64h + 32 (r % 2) + l] and bits 2r, 2r + 1 of
 *            qh[32h + l]; one scale per 16 values.
 *
 * Work split: rows of W over threads (rp_split, 16 rows a part) by rp_parallel. A
 * thread takes its rows in tiles of rows x tokens with 4 accumulator cells (each two
 * zmm, for even and odd chunk pairs), kept in registers: on the zmm path 4 rows x 1
 * token at T = 1 (8 independent FMA chains; each activation load serves 4 rows),
 * 2 x 2 at T = 2, else 1 row x 4 tokens; the ymm and plain-C paths take 1 x 4. A
 * tile's rows' scales (a, b) are decoded once, and each weight block is read once for
 * every 4 tokens: once per call at decode. On the zmm path at T <= 2 on the 32-block
 * formats the scales are decoded one tile ahead (their first reads of the next tile's
 * blocks overlap this tile's dot products, and their stores have drained when they
 * are read back), and each tile prefetches the weight 16 KB ahead: a decode step
 * reads its weights from memory. Neither changes an operation of the arithmetic. The
 * activation's quantization runs first (split over tokens when it is large).
 * The caller (rawpage/native/gguf.py) passes the scratch: xq (T, K) int8, then
 * dx (T, K / 32) float, s (T, K / 32) float.
 */
#include <math.h>
#include <pthread.h>

#include "common.h"

#define RP_INLINE static inline __attribute__((always_inline))

/* GGML's type ids (gguf.GGMLQuantizationType). */
enum { GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q8_0 = 8, GGML_Q4_K = 12, GGML_Q5_K = 13, GGML_Q6_K = 14 };

typedef uint16_t f16; /* raw IEEE half bits */

typedef struct { f16 d; int8_t qs[32]; } block_q8_0;
typedef struct { f16 d; uint8_t qs[16]; } block_q4_0;
typedef struct { f16 d, m; uint8_t qs[16]; } block_q4_1;
typedef struct { f16 d, dmin; uint8_t scales[12]; uint8_t qs[128]; } block_q4_K;
typedef struct { f16 d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } block_q5_K;
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; f16 d; } block_q6_K;

_Static_assert(sizeof(block_q8_0) == 34 && sizeof(block_q4_0) == 18 && sizeof(block_q4_1) == 20, "32-blocks");
_Static_assert(sizeof(block_q4_K) == 144 && sizeof(block_q5_K) == 176 && sizeof(block_q6_K) == 210, "K-blocks");

RP_INLINE int fmt_qk(int f) { return f == GGML_Q4_K || f == GGML_Q5_K || f == GGML_Q6_K ? 256 : 32; }
RP_INLINE int fmt_bytes(int f) {
    switch (f) {
    case GGML_Q8_0: return 34;
    case GGML_Q4_0: return 18;
    case GGML_Q4_1: return 20;
    case GGML_Q4_K: return 144;
    case GGML_Q5_K: return 176;
    default: return 210;
    }
}
RP_INLINE int fmt_group(int f) { return f == GGML_Q6_K ? 16 : 32; } /* values per scale a_g */
RP_INLINE int fmt_signed(int f) { return f == GGML_Q8_0 || f == GGML_Q6_K; } /* no b term */

static int known_fmt(int f) {
    return f == GGML_Q4_0 || f == GGML_Q4_1 || f == GGML_Q8_0 || f == GGML_Q4_K || f == GGML_Q5_K || f == GGML_Q6_K;
}

RP_INLINE float f16_at(const uint8_t *p) {
    f16 h;
    memcpy(&h, p, 2); /* blocks are only 2-byte aligned */
    return rp_f16_to_f32(h);
}

/* The 6-bit scale sc and min m of chunk j of a Q4_K / Q5_K superblock: chunks 0-3 keep
 * them in the low 6 bits of bytes j and j + 4; chunks 4-7 in the nibbles of byte
 * j + 4, with their top 2 bits in the spare top bits of bytes j - 4 and j. */
RP_INLINE void k_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* --- plain C: one block's scales and integers --------------------------------------- */

/* a[QK / G] and (unsigned formats) b[QK / 32] of one block. */
RP_INLINE void block_scales(const int f, const uint8_t *blk, float *a, float *b) {
    if (f == GGML_Q8_0) {
        a[0] = f16_at(blk);
    } else if (f == GGML_Q4_0) {
        a[0] = f16_at(blk);
        b[0] = -8.0f * a[0];
    } else if (f == GGML_Q4_1) {
        a[0] = f16_at(blk);
        b[0] = f16_at(blk + 2);
    } else if (f == GGML_Q4_K || f == GGML_Q5_K) {
        const float d = f16_at(blk), dmin = f16_at(blk + 2);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            k_scale_min(blk + 4, j, &sc, &m);
            a[j] = d * (float)sc;
            b[j] = -dmin * (float)m;
        }
    } else {
        const block_q6_K *q = (const block_q6_K *)blk;
        const float d = f16_at(blk + 208);
        for (int g = 0; g < 16; g++) a[g] = d * (float)q->scales[g];
    }
}

/* The block's QK integers q, in value order. */
RP_INLINE void block_ints(const int f, const uint8_t *blk, int8_t *q) {
    if (f == GGML_Q8_0) {
        memcpy(q, blk + 2, 32);
    } else if (f == GGML_Q4_0 || f == GGML_Q4_1) {
        const uint8_t *qs = blk + (f == GGML_Q4_0 ? 2 : 4);
        for (int i = 0; i < 16; i++) {
            q[i] = (int8_t)(qs[i] & 15);
            q[i + 16] = (int8_t)(qs[i] >> 4);
        }
    } else if (f == GGML_Q4_K || f == GGML_Q5_K) {
        const uint8_t *qh = blk + 16, *qs = blk + (f == GGML_Q4_K ? 16 : 48);
        for (int j = 0; j < 8; j++)
            for (int l = 0; l < 32; l++) {
                int v = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15;
                if (f == GGML_Q5_K) v |= ((qh[l] >> j) & 1) << 4;
                q[32 * j + l] = (int8_t)v;
            }
    } else {
        const block_q6_K *b = (const block_q6_K *)blk;
        for (int h = 0; h < 2; h++)
            for (int r = 0; r < 4; r++)
                for (int l = 0; l < 32; l++) {
                    int lo = (b->ql[64 * h + 32 * (r % 2) + l] >> (4 * (r / 2))) & 15;
                    int hi = (b->qh[32 * h + l] >> (2 * r)) & 3;
                    q[128 * h + 32 * r + l] = (int8_t)((lo | (hi << 4)) - 32);
                }
    }
}

/* A row's scales: a[K / G], b[K / 32]; both zero-padded by 16 past the end, so that
 * vector loads of a pair's scales and the b term's last group read zeros. */
RP_INLINE void row_scales(const int f, const uint8_t *row, int64_t K, float *a, float *b) {
    const int qk = fmt_qk(f), bytes = fmt_bytes(f), na = qk / fmt_group(f), nb = qk / 32;
    for (int64_t i = 0; i < K / qk; i++) block_scales(f, row + i * bytes, a + i * na, b + i * nb);
    for (int i = 0; i < 16; i++) a[K / fmt_group(f) + i] = b[K / 32 + i] = 0.0f;
    if (fmt_signed(f))
        for (int64_t c = 0; c < K / 32; c++) b[c] = 0.0f;
}

/* --- the activation: int8 per 32-value chunk ------------------------------------------ */

/* One token: x (K) -> xq (K) int8, dx (K / 32), s (K / 32). */
static void quantize_row(const float *x, int8_t *xq, float *dxs, float *s, int64_t K) {
    for (int64_t c = 0; c < K / 32; c++) {
        const float *v = x + 32 * c;
        int8_t *q = xq + 32 * c;
        float dx;
        int sum = 0;
#if RP_AVX2
        /* the same float32 arithmetic as the reference: |x| max, a true division, and
         * round half to even (the default MXCSR mode) */
        const __m256 sign = _mm256_set1_ps(-0.0f);
        __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8);
        __m256 v2 = _mm256_loadu_ps(v + 16), v3 = _mm256_loadu_ps(v + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        dx = _mm_cvtss_f32(m4) / 127.0f;
        if (dx > 0.0f) {
            const __m256 d = _mm256_set1_ps(dx);
            const int rnd = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
            __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_div_ps(v0, d), rnd));
            __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_div_ps(v1, d), rnd));
            __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_div_ps(v2, d), rnd));
            __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_div_ps(v3, d), rnd));
            /* packs work per 128-bit lane: the dwords come out as i0[0:4] i1[0:4] i2[0:4]
             * i3[0:4] i0[4:8] ..., put back in order by the permute */
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
            p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)q, p);
            __m256i s32 = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
            sum = _mm_cvtsi128_si32(s4);
        } else {
            memset(q, 0, 32);
        }
#else
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
        dx = amax / 127.0f;
        for (int i = 0; i < 32; i++) {
            q[i] = dx > 0.0f ? (int8_t)rintf(v[i] / dx) : 0;
            sum += q[i];
        }
#endif
        dxs[c] = dx;
        s[c] = dx * (float)sum;
    }
}

/* --- one call's arguments, shared by its parts --------------------------------------- */

typedef struct {
    int fmt;
    float *y;            /* (T, N); gguf_rows: (T, K) */
    const float *x;      /* (T, K) */
    const uint8_t *w;    /* (N, row_bytes) */
    const float *bias;   /* (N) or NULL */
    const int32_t *ids;  /* gguf_rows: (T) row ids (token ids, the batch's int32) */
    int64_t T, N, K, row_bytes;
    int8_t *xq;          /* (T, K) */
    float *dx;           /* (T, K / 32) */
    float *s;            /* (T, K / 32) */
} gguf_call;

/* The scratch: xq (T, K) int8, dx (T, K / 32), s (T, K / 32); 4-byte aligned. */
static void scratch_views(gguf_call *c, uint8_t *scratch) {
    c->xq = (int8_t *)scratch;
    c->dx = (float *)(scratch + c->T * c->K);
    c->s = c->dx + c->T * (c->K / 32);
}

static void quantize_task(void *arg, int ith, int nth) {
    const gguf_call *c = arg;
    int64_t t0, t1;
    rp_split(c->T, 1, ith, nth, &t0, &t1);
    for (int64_t t = t0; t < t1; t++)
        quantize_row(c->x + t * c->K, c->xq + t * c->K, c->dx + t * (c->K / 32), c->s + t * (c->K / 32), c->K);
}

/* --- the dot products: y[t0 .. t0 + NT, n] for one row -------------------------------- */

#define TOKEN_TILE 4

#if RP_AVX512VNNI
/* Pair p of the row (chunks 2p, 2p + 1) as 64 integers; `half`: chunk 2p only (the
 * last pair of a row with an odd number of 32-blocks), the rest zero. */
RP_INLINE __m512i pair_ints_zmm(const int f, const uint8_t *row, int64_t p, const int half) {
    const __m512i nib = _mm512_set1_epi8(15);
    if (f == GGML_Q8_0) {
        const uint8_t *b = row + 2 * p * 34 + 2;
        __m512i v = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)b));
        return half ? v : _mm512_inserti64x4(v, _mm256_loadu_si256((const __m256i *)(b + 34)), 1);
    }
    if (f == GGML_Q4_0 || f == GGML_Q4_1) {
        const int bytes = f == GGML_Q4_0 ? 18 : 20;
        const uint8_t *qs = row + 2 * p * bytes + (f == GGML_Q4_0 ? 2 : 4);
        /* 128-bit lanes [qs0, qs0, qs1, qs1], the odd ones then moved to their high nibbles */
        __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)qs));
        v = half ? _mm512_maskz_mov_epi32(0x00ff, v)
                 : _mm512_mask_broadcast_i32x4(v, 0xff00, _mm_loadu_si128((const __m128i *)(qs + bytes)));
#if defined(__GFNI__)
        /* one GF(2) affine map per byte: output bit i is the byte's bit i (lanes 0, 2) or
         * bit i + 4 (lanes 1, 3); the matrix's row for bit i is its byte 7 - i */
        const long long lo = 0x0102040800000000ll, hi = 0x1020408000000000ll;
        return _mm512_gf2p8affine_epi64_epi8(v, _mm512_set_epi64(hi, hi, lo, lo, hi, hi, lo, lo), 0);
#else
        return _mm512_and_si512(_mm512_mask_srli_epi16(v, 0xff00ff00u, v, 4), nib);
#endif
    }
    const int64_t sb = p / 4, g = p % 4; /* 4 pairs per superblock */
    if (f == GGML_Q4_K || f == GGML_Q5_K) {
        const uint8_t *blk = row + sb * fmt_bytes(f);
        /* chunks 2g (low nibbles) and 2g + 1 (high) of the same 32 bytes */
        __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + (f == GGML_Q4_K ? 16 : 48) + 32 * g)));
        v = _mm512_and_si512(_mm512_mask_srli_epi16(v, 0xffff0000u, v, 4), nib);
        if (f == GGML_Q5_K) { /* bit 4: bit 2g (low half) or 2g + 1 (high half) of qh[l] */
            const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16)));
            const __m512i sel = _mm512_mask_blend_epi64(0xf0, _mm512_set1_epi8((char)(1 << (2 * g))),
                                                        _mm512_set1_epi8((char)(2 << (2 * g))));
            v = _mm512_mask_add_epi8(v, _mm512_test_epi8_mask(qh, sel), v, _mm512_set1_epi8(16));
        }
        return v;
    }
    /* Q6_K: pair g is chunks r = 2 (g % 2), r + 1 of half g / 2 */
    const uint8_t *blk = row + sb * 210;
    const int h = (int)(g / 2), r2 = (int)(g % 2);
    __m512i lo = _mm512_loadu_si512(blk + 64 * h); /* chunk r: ql[32 (r % 2) ..], nibble r / 2 */
    lo = _mm512_and_si512(r2 ? _mm512_srli_epi16(lo, 4) : lo, nib);
    __m512i hi = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h)));
    const __m512i cnt = _mm512_mask_blend_epi64(0xf0, _mm512_set1_epi16((short)(4 * r2)), _mm512_set1_epi16((short)(4 * r2 + 2)));
    hi = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(hi, cnt), _mm512_set1_epi8(3)), 4);
    return _mm512_sub_epi8(_mm512_or_si512(lo, hi), _mm512_set1_epi8(32));
}

/* The first two half-words of 16 consecutive blocks of `bytes` each (d, and Q4_1's
 * m), as 32 halves: d of block i in 16-bit lane i, the second one in lane 16 + i.
 * A gather takes ~16 cycles for 16 blocks; this takes the words out of the blocks'
 * own cache lines (the pairs read them next) with one two-register word permute
 * (vpermt2w) per 128 bytes. Window w of the group's bytes, [128 w, 128 w + 128),
 * gives the lanes in `here[w]`, from its words `idx[w]`. */
typedef struct {
    int16_t idx[5][32];
    __mmask32 here[5];
} heads_plan;

static heads_plan heads_plans[3]; /* Q4_0, Q4_1, Q8_0 */
static pthread_once_t heads_once = PTHREAD_ONCE_INIT;

static void make_heads_plans(void) {
    const int bytes[3] = {18, 20, 34};
    for (int k = 0; k < 3; k++)
        for (int w = 0; w < 5; w++) {
            heads_plans[k].here[w] = 0;
            for (int i = 0; i < 32; i++) {
                const int src = (i % 16) * (bytes[k] / 2) + i / 16; /* block i % 16's word i / 16 */
                heads_plans[k].idx[w][i] = (int16_t)(src & 63);
                if (src / 64 == w) heads_plans[k].here[w] |= 1u << i;
            }
        }
}

RP_INLINE __m512i group_heads_zmm(const int f, const uint8_t *g, const __m512i *idx, const __mmask32 *here) {
    const int n = 16 * fmt_bytes(f);
    __m512i h = _mm512_setzero_si512();
    for (int w = 0; 128 * w < n; w++) { /* constant bounds and masks: unrolled */
        const int left = n - 128 * w;
        const __mmask64 m0 = left >= 64 ? ~0ull : (1ull << left) - 1;
        const __mmask64 m1 = left >= 128 ? ~0ull : left > 64 ? (1ull << (left - 64)) - 1 : 0;
        const __m512i lo = _mm512_maskz_loadu_epi8(m0, g + 128 * w), hi = _mm512_maskz_loadu_epi8(m1, g + 128 * w + 64);
        h = _mm512_mask_mov_epi16(h, here[w], _mm512_permutex2var_epi16(lo, idx[w], hi));
    }
    return h;
}

/* The scales of the group of chunks from chunk c0, in registers: a, one lane per
 * scale group (a chunk; Q6_K: 16 values), and b, one lane per chunk. A group is 16
 * 32-blocks (the row's last one shorter) or one superblock (8 chunks). */
RP_INLINE void group_scales_zmm(const int f, const uint8_t *row, int64_t c0, const __m512i *idx, const __mmask32 *here,
                                __m512 *a, __m512 *b) {
    if (fmt_qk(f) == 32) {
        /* a short group is read as a whole one: the caller zeroes the extra lanes */
        const __m512i h = group_heads_zmm(f, row + c0 * fmt_bytes(f), idx, here);
        *a = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
        *b = f == GGML_Q4_1 ? _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1))
                            : _mm512_mul_ps(*a, _mm512_set1_ps(-8.0f)); /* Q4_0; Q8_0 has no b */
        return;
    }
    const uint8_t *blk = row + (c0 / 8) * fmt_bytes(f);
    if (f == GGML_Q6_K) {
        const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 192)));
        *a = _mm512_mul_ps(_mm512_set1_ps(f16_at(blk + 208)), _mm512_cvtepi32_ps(sc));
        return;
    }
    /* Q4_K / Q5_K: k_scale_min for all 8 chunks at once, a byte each, on 32-bit words of
     * the 12 scale bytes: chunks 0-3 are the low 6 bits of words 0 (sc) and 1 (m);
     * chunks 4-7 the nibbles of word 2 and the top 2 bits of words 0 and 1. */
    uint32_t w[3];
    memcpy(w, blk + 4, 12);
    const uint64_t sc = (w[0] & 0x3f3f3f3fu) | (uint64_t)((w[2] & 0x0f0f0f0fu) | ((w[0] >> 2) & 0x30303030u)) << 32;
    const uint64_t mn = (w[1] & 0x3f3f3f3fu) | (uint64_t)(((w[2] >> 4) & 0x0f0f0f0fu) | ((w[1] >> 2) & 0x30303030u)) << 32;
    const __m512 scf = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc)));
    const __m512 mnf = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn)));
    *a = _mm512_mul_ps(_mm512_set1_ps(f16_at(blk)), scf);
    *b = _mm512_mul_ps(_mm512_set1_ps(-f16_at(blk + 2)), mnf);
}

#define L8(v) v, v, v, v, v, v, v, v
#define L4(v) v, v, v, v
/* Pair p of a group takes its 16 lanes' scales from these lanes of the group's a dx:
 * 2 chunks of 8 lanes, or Q6_K's 4 groups of 16 values, 4 lanes each. */
static const int32_t pair_lanes[8][16] = {{L8(0), L8(1)},   {L8(2), L8(3)},   {L8(4), L8(5)},   {L8(6), L8(7)},
                                          {L8(8), L8(9)},   {L8(10), L8(11)}, {L8(12), L8(13)}, {L8(14), L8(15)}};
static const int32_t pair_lanes_q6k[4][16] = {{L4(0), L4(1), L4(2), L4(3)},
                                              {L4(4), L4(5), L4(6), L4(7)},
                                              {L4(8), L4(9), L4(10), L4(11)},
                                              {L4(12), L4(13), L4(14), L4(15)}};
#undef L8
#undef L4

/* acc[r NT + t] += the pair's 64 products of row r and token t, each int32 lane
 * times its a dx. Each token's 64 activations are loaded once for the NR rows. */
RP_INLINE void pair_fma_zmm(const int f, const int NR, const int NT, const uint8_t *const *rows, int64_t pg, int p,
                            const int half, const int8_t *xq, int64_t K, const __m512 *sc, __m512 *acc) {
    const __m512i flip = _mm512_set1_epi8((char)0x80), zero = _mm512_setzero_si512();
    const __m512i lanes = _mm512_loadu_si512(f == GGML_Q6_K ? pair_lanes_q6k[p] : pair_lanes[p]);
    const __mmask64 xmask = half ? 0xffffffffull : ~0ull;
    __m512i wq[4], init[4];
    for (int r = 0; r < NR; r++) {
        wq[r] = pair_ints_zmm(f, rows[r], pg, half);
        /* signed q: (xq + 128) q - 128 sum q, the second term once per pair for all tokens */
        init[r] = fmt_signed(f) ? _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, flip, wq[r])) : zero;
    }
    for (int t = 0; t < NT; t++) {
        __m512i xv = _mm512_maskz_loadu_epi8(xmask, xq + t * K + 64 * pg);
        if (fmt_signed(f)) xv = _mm512_xor_si512(xv, flip);
        for (int r = 0; r < NR; r++) {
            const __m512i dot = fmt_signed(f) ? _mm512_dpbusd_epi32(init[r], xv, wq[r]) : _mm512_dpbusd_epi32(zero, wq[r], xv);
            const int i = r * NT + t;
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_permutexvar_ps(lanes, sc[i]), acc[i]);
        }
    }
}

/* The row's group scales, 16 floats a group for a and b: computed before the dot
 * products, so that their latency (loads, permutes, conversions) is off the path of
 * the accumulators, and once per row for all token tiles. */
RP_INLINE void row_scales_zmm(const int f, const uint8_t *row, int64_t K, const uint8_t *end, float *a, float *b) {
    const int64_t nc = K / 32, gc = fmt_qk(f) == 32 ? 16 : 8;
    /* the 32-block formats' heads plan: its permutes and masks in registers for the run */
    const heads_plan *plan = &heads_plans[f == GGML_Q4_0 ? 0 : f == GGML_Q4_1 ? 1 : 2];
    __m512i idx[5];
    __mmask32 here[5];
    if (fmt_qk(f) == 32)
        for (int w = 0; w < 5; w++) idx[w] = _mm512_loadu_si512(plan->idx[w]), here[w] = plan->here[w];
    for (int64_t c0 = 0, g = 0; c0 < nc; c0 += gc, g++) {
        __m512 av, bv = _mm512_setzero_ps();
        if (nc - c0 >= gc) {
            group_scales_zmm(f, row, c0, idx, here, &av, &bv);
        } else if (row + (c0 + gc) * fmt_bytes(f) <= end) {
            /* the row's short last group, read as a whole one (the next row's blocks are
             * there) and the extra lanes zeroed: they may hold any half, inf or NaN */
            const __mmask16 m = (__mmask16)((1u << (nc - c0)) - 1);
            group_scales_zmm(f, row, c0, idx, here, &av, &bv);
            av = _mm512_maskz_mov_ps(m, av), bv = _mm512_maskz_mov_ps(m, bv);
        } else { /* the weight's last blocks: one at a time, reading nothing past them */
            for (int64_t i = 0; i < 16; i++) {
                a[16 * g + i] = c0 + i < nc ? f16_at(row + (c0 + i) * fmt_bytes(f)) : 0.0f;
                b[16 * g + i] = c0 + i >= nc ? 0.0f
                                : f == GGML_Q4_1 ? f16_at(row + (c0 + i) * fmt_bytes(f) + 2)
                                                 : -8.0f * a[16 * g + i];
            }
            continue;
        }
        _mm512_storeu_ps(a + 16 * g, av);
        _mm512_storeu_ps(b + 16 * g, bv);
    }
}

/* The scales of rows n .. n + nr, one run of blocks: in groups across the row ends
 * (fewer short groups; row r's start at r gs). */
RP_INLINE void tile_scales_zmm(const int f, const gguf_call *c, int64_t n, int64_t nr, float *ga, float *gb) {
    row_scales_zmm(f, c->w + n * c->row_bytes, nr * c->K, c->w + c->N * c->row_bytes, ga, gb);
}

/* out[r NT + t] = y[t0 + t, row r] without bias, for NR rows x NT tokens (NR NT <= 4):
 * at decode 4 rows x 1 token, so that there are 8 independent accumulator chains and
 * each activation load serves 4 rows; in prefill 1 row x 4 tokens. ga, gb: the rows'
 * scales (row_scales_zmm), gs floats apart; lanes past a row's end are masked off. */
RP_INLINE void dot_tile_zmm(const int f, const int NR, const int NT, const gguf_call *c, const uint8_t *const *rows,
                            const float *ga, const float *gb, int64_t gs, int64_t t0, float *out) {
    const int64_t K = c->K, nc = K / 32;
    const int8_t *xq = c->xq + t0 * K;
    const float *dx = c->dx + t0 * nc, *s = c->s + t0 * nc;
    const int gc = fmt_qk(f) == 32 ? 16 : 8; /* chunks per group */
    const __m512i chunk_of = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    /* two accumulators a cell, for even and odd pairs: one chain of FMAs would wait on
     * its own latency */
    __m512 acc0[4], acc1[4];
    for (int i = 0; i < NR * NT; i++) acc0[i] = acc1[i] = _mm512_setzero_ps();
    for (int64_t c0 = 0, g = 0; c0 < nc; c0 += gc, g++) {
        const int nch = nc - c0 < gc ? (int)(nc - c0) : gc;
        const __mmask16 cm = (__mmask16)((1u << nch) - 1), am = f == GGML_Q6_K ? 0xffff : cm; /* lanes of a */
        __m512 sc[4];
        for (int t = 0; t < NT; t++) {
            __m512 d = _mm512_maskz_loadu_ps(cm, dx + t * nc + c0);
            if (f == GGML_Q6_K) d = _mm512_permutexvar_ps(chunk_of, d); /* 2 scales a chunk */
            const __m512 sv = _mm512_maskz_loadu_ps(cm, s + t * nc + c0);
            for (int r = 0; r < NR; r++) {
                sc[r * NT + t] = _mm512_mul_ps(_mm512_maskz_loadu_ps(am, ga + r * gs + 16 * g), d);
                if (!fmt_signed(f)) /* + sum_c b_c s[t, c] */
                    acc1[r * NT + t] =
                        _mm512_fmadd_ps(_mm512_maskz_loadu_ps(cm, gb + r * gs + 16 * g), sv, acc1[r * NT + t]);
            }
        }
        const int full = nch / 2; /* pairs of two chunks; an odd row of 32-blocks ends with one */
        int p = 0;
        for (; p + 1 < full; p += 2) {
            pair_fma_zmm(f, NR, NT, rows, c0 / 2 + p, p, 0, xq, K, sc, acc0);
            pair_fma_zmm(f, NR, NT, rows, c0 / 2 + p + 1, p + 1, 0, xq, K, sc, acc1);
        }
        if (p < full) pair_fma_zmm(f, NR, NT, rows, c0 / 2 + p, p, 0, xq, K, sc, acc0), p++;
        if (nch & 1) pair_fma_zmm(f, NR, NT, rows, c0 / 2 + p, p, 1, xq, K, sc, acc1);
    }
    for (int i = 0; i < NR * NT; i++) acc0[i] = _mm512_add_ps(acc0[i], acc1[i]);
    for (int i = NR * NT; i < 4; i++) acc0[i] = _mm512_setzero_ps();
    /* The 4 sums at once (~12 instructions, not 4 reductions of 8), and for fewer cells
     * too, padded: every cell's 16 lanes are added in the same order whatever the tile,
     * so y[t, n] has the same bits at any T (a sequence computes the same alone or in a
     * batch; tests/test_engine.py's batch invariance). */
    const __m512 t01 = _mm512_add_ps(_mm512_unpacklo_ps(acc0[0], acc0[1]), _mm512_unpackhi_ps(acc0[0], acc0[1]));
    const __m512 t23 = _mm512_add_ps(_mm512_unpacklo_ps(acc0[2], acc0[3]), _mm512_unpackhi_ps(acc0[2], acc0[3]));
    /* each 128-bit lane: partial sums of cells 0, 1, 2, 3 */
    const __m512 u = _mm512_add_ps(_mm512_shuffle_ps(t01, t23, 0x44), _mm512_shuffle_ps(t01, t23, 0xee));
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(u), _mm512_extractf32x8_ps(u, 1));
    float sums[4];
    _mm_storeu_ps(sums, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
    for (int i = 0; i < NR * NT; i++) out[i] = sums[i];
}

/* y[:, n .. n + NR] (+ bias), the tokens NT at a time, from the NR rows' scales ga, gb
 * (tile_scales_zmm). */
RP_INLINE void rows_zmm(const int f, const int NR, const gguf_call *c, int64_t n, const float *ga, const float *gb,
                        int64_t gs) {
    const uint8_t *rows[4];
    for (int r = 0; r < NR; r++) rows[r] = c->w + (n + r) * c->row_bytes;
    for (int64_t t0 = 0; t0 < c->T; t0 += TOKEN_TILE / NR) {
        const int nt = c->T - t0 < TOKEN_TILE / NR ? (int)(c->T - t0) : TOKEN_TILE / NR;
        float out[4];
        if (NR == 4) dot_tile_zmm(f, 4, 1, c, rows, ga, gb, gs, t0, out);
        else if (NR == 2 && nt == 2) dot_tile_zmm(f, 2, 2, c, rows, ga, gb, gs, t0, out);
        else if (NR == 2) dot_tile_zmm(f, 2, 1, c, rows, ga, gb, gs, t0, out);
        else switch (nt) {
            case 1: dot_tile_zmm(f, 1, 1, c, rows, ga, gb, gs, t0, out); break;
            case 2: dot_tile_zmm(f, 1, 2, c, rows, ga, gb, gs, t0, out); break;
            case 3: dot_tile_zmm(f, 1, 3, c, rows, ga, gb, gs, t0, out); break;
            default: dot_tile_zmm(f, 1, 4, c, rows, ga, gb, gs, t0, out); break;
            }
        for (int r = 0; r < NR; r++)
            for (int t = 0; t < nt; t++)
                c->y[(t0 + t) * c->N + n + r] = out[r * nt + t] + (c->bias ? c->bias[n + r] : 0.0f);
    }
}
#endif

#if RP_AVXVNNI || RP_AVX2
/* Chunk c of the row as 32 integers. */
RP_INLINE __m256i chunk_ints_ymm(const int f, const uint8_t *row, int64_t c) {
    const __m256i nib = _mm256_set1_epi8(15);
    if (f == GGML_Q8_0) return _mm256_loadu_si256((const __m256i *)(row + c * 34 + 2));
    if (f == GGML_Q4_0 || f == GGML_Q4_1) {
        const __m128i v = _mm_loadu_si128((const __m128i *)(row + c * fmt_bytes(f) + (f == GGML_Q4_0 ? 2 : 4)));
        return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), nib);
    }
    const uint8_t *blk = row + (c / 8) * fmt_bytes(f);
    const int j = (int)(c % 8);
    if (f == GGML_Q4_K || f == GGML_Q5_K) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + (f == GGML_Q4_K ? 16 : 48) + 32 * (j / 2)));
        __m256i q = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(v, 4) : v, nib);
        if (f == GGML_Q5_K) {
            const __m256i bit = _mm256_set1_epi8((char)(1 << j));
            const __m256i qh = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(blk + 16)), bit);
            q = _mm256_or_si256(q, _mm256_and_si256(_mm256_cmpeq_epi8(qh, bit), _mm256_set1_epi8(16)));
        }
        return q;
    }
    const int h = j / 4, r = j % 4; /* Q6_K */
    __m256i lo = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32 * (r % 2)));
    lo = _mm256_and_si256(_mm256_srl_epi16(lo, _mm_cvtsi32_si128(4 * (r / 2))), nib);
    __m256i hi = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
    hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(hi, _mm_cvtsi32_si128(2 * r)), _mm256_set1_epi8(3)), 4);
    return _mm256_sub_epi8(_mm256_or_si256(lo, hi), _mm256_set1_epi8(32));
}

/* sum over each 4 bytes of u (unsigned) times s (signed), as 8 int32 */
RP_INLINE __m256i dot_u8s8_ymm(__m256i u, __m256i s) {
#if RP_AVXVNNI && defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#elif RP_AVXVNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else /* maddubs: pairs into int16, which cannot saturate here (|u| <= 128, |s| <= 127, u s of a pair < 2^15) */
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

RP_INLINE float hsum_ymm(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

/* acc[t] += chunk ci's 32 products for each token, each int32 lane times its a dx. */
RP_INLINE void chunk_fma_ymm(const int f, const int NT, const uint8_t *row, int64_t ci, const float *a,
                             const int8_t *xq, const float *dx, int64_t K, __m256 *acc) {
    const int64_t nc = K / 32;
    const __m256i wq = chunk_ints_ymm(f, row, ci);
    /* Q6_K: lanes 0-3 take the chunk's first 16 values' scale, 4-7 the second's */
    const __m256 ac = f == GGML_Q6_K ? _mm256_set_m128(_mm_set1_ps(a[2 * ci + 1]), _mm_set1_ps(a[2 * ci]))
                                     : _mm256_set1_ps(a[ci]);
    const __m256i wu = fmt_signed(f) ? _mm256_abs_epi8(wq) : wq; /* signed: |q| and xq sign(q) */
    for (int t = 0; t < NT; t++) {
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + t * K + 32 * ci));
        const __m256i dot = dot_u8s8_ymm(wu, fmt_signed(f) ? _mm256_sign_epi8(xv, wq) : xv);
        const __m256 scale = _mm256_mul_ps(ac, _mm256_set1_ps(dx[t * nc + ci]));
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[t]);
    }
}

RP_INLINE void dot_tile_ymm(const int f, const int NT, const gguf_call *c, const uint8_t *row, const float *a,
                            const float *b, int64_t t0, float *out) {
    const int64_t K = c->K, nc = K / 32;
    const int8_t *xq = c->xq + t0 * K;
    const float *dx = c->dx + t0 * nc, *s = c->s + t0 * nc;
    /* two accumulators a token, even and odd chunks: one chain would wait on its own
     * FMA latency at T = 1 */
    __m256 acc[TOKEN_TILE], acc1[TOKEN_TILE];
    for (int t = 0; t < NT; t++) acc[t] = acc1[t] = _mm256_setzero_ps();
    int64_t ci = 0;
    for (; ci + 1 < nc; ci += 2) {
        chunk_fma_ymm(f, NT, row, ci, a, xq, dx, K, acc);
        chunk_fma_ymm(f, NT, row, ci + 1, a, xq, dx, K, acc1);
    }
    if (ci < nc) chunk_fma_ymm(f, NT, row, ci, a, xq, dx, K, acc);
    for (int t = 0; t < NT; t++) acc[t] = _mm256_add_ps(acc[t], acc1[t]);
    float tail[TOKEN_TILE] = {0};
    if (!fmt_signed(f)) {
        int64_t c0 = 0;
        for (; c0 + 8 <= nc; c0 += 8) {
            const __m256 bv = _mm256_loadu_ps(b + c0);
            for (int t = 0; t < NT; t++) acc[t] = _mm256_fmadd_ps(bv, _mm256_loadu_ps(s + t * nc + c0), acc[t]);
        }
        for (; c0 < nc; c0++)
            for (int t = 0; t < NT; t++) tail[t] += b[c0] * s[t * nc + c0];
    }
    for (int t = 0; t < NT; t++) out[t] = hsum_ymm(acc[t]) + tail[t];
}
#endif

/* Plain C (defines the result): the row's integers are decoded once into q (K). */
RP_INLINE void dot_tile_c(const int f, const int NT, const gguf_call *c, const int8_t *q, const float *a,
                          const float *b, int64_t t0, float *out) {
    const int64_t K = c->K, nc = K / 32, G = fmt_group(f);
    for (int t = 0; t < NT; t++) {
        const int8_t *xq = c->xq + (t0 + t) * K;
        const float *dx = c->dx + (t0 + t) * nc, *s = c->s + (t0 + t) * nc;
        float acc = 0.0f;
        for (int64_t g = 0; g < K / G; g++) {
            int32_t dot = 0;
            for (int64_t k = g * G; k < (g + 1) * G; k++) dot += (int32_t)q[k] * (int32_t)xq[k];
            acc += (float)dot * (a[g] * dx[g * G / 32]);
        }
        if (!fmt_signed(f))
            for (int64_t ci = 0; ci < nc; ci++) acc += b[ci] * s[ci];
        out[t] = acc;
    }
}

/* Tokens t0 .. t0 + nt of one row, nt <= TOKEN_TILE: a constant tile size for each
 * case, so that the accumulators stay in registers. */
RP_INLINE void dot_tile(const int f, int nt, const gguf_call *c, const uint8_t *row, const int8_t *q, const float *a,
                        const float *b, int64_t t0, float *out) {
#if RP_AVXVNNI || RP_AVX2
#define DOT_TILE(NT) dot_tile_ymm(f, NT, c, row, a, b, t0, out)
    (void)q;
#else
#define DOT_TILE(NT) dot_tile_c(f, NT, c, q, a, b, t0, out)
    (void)row;
#endif
    switch (nt) {
    case 1: DOT_TILE(1); break;
    case 2: DOT_TILE(2); break;
    case 3: DOT_TILE(3); break;
    default: DOT_TILE(4); break;
    }
#undef DOT_TILE
}

#if RP_AVX512VNNI
/* In a decode step every weight comes from memory (a model's layers do not fit the
 * L3), and the hardware prefetchers alone keep too few of its lines in flight: each
 * tile asks for the bytes PREFETCH_AHEAD past its own, up to the weight's end (the
 * next thread's first rows too). 16 KB: 4 and 8 KB measured slower on the development
 * VM, 32 KB slower. */
#define PREFETCH_AHEAD 16384
RP_INLINE void prefetch_ahead(const uint8_t *tile, int64_t bytes, const uint8_t *end) {
    for (const uint8_t *p = tile + PREFETCH_AHEAD; p < tile + PREFETCH_AHEAD + bytes && p < end; p += 64)
        _mm_prefetch((const char *)p, _MM_HINT_T0);
}
#endif

/* Rows n0 .. n1 of y for every token. */
RP_INLINE void matmul_rows(const int f, const gguf_call *c, int64_t n0, int64_t n1) {
    const int64_t K = c->K, T = c->T, N = c->N;
#if RP_AVX512VNNI
    /* one row's group scales: a float a chunk (32-blocks), 16 a superblock (K-quants) */
    const int64_t gs = fmt_qk(f) == 32 ? K / 32 : K / 16;
    float ga[2][4 * gs + 16], gb[2][4 * gs + 16];
    /* tiles of NR rows (decode: 4 rows at a time), then single rows */
    const int NR = T == 1 ? 4 : T == 2 ? 2 : 1;
    int64_t n = n0;
    if (fmt_qk(f) == 32 && T <= 2) {
        /* decode on the 32-block formats, where the scales' gather is a quarter of the
         * work: each tile's scales are made while the tile before is still ahead of
         * them (their first reads of the tile's blocks, from L2 or memory, overlap that
         * tile's dot products, and their stores have drained when they are read back),
         * and the weight is prefetched. (Not with more tokens: 5-10% slower from T = 8
         * on; nor on the K-quants, where Q6_K measured slower at T = 1.) */
        int64_t nr = n + NR <= n1 ? NR : 1;
        int buf = 0;
        if (n < n1) tile_scales_zmm(f, c, n, nr, ga[buf], gb[buf]);
        while (n < n1) {
            const int64_t next = n + nr, next_nr = next + NR <= n1 ? NR : 1;
            if (next < n1) tile_scales_zmm(f, c, next, next_nr, ga[buf ^ 1], gb[buf ^ 1]);
            prefetch_ahead(c->w + n * c->row_bytes, nr * c->row_bytes, c->w + N * c->row_bytes);
            if (nr == 4) rows_zmm(f, 4, c, n, ga[buf], gb[buf], gs);
            else if (nr == 2) rows_zmm(f, 2, c, n, ga[buf], gb[buf], gs);
            else rows_zmm(f, 1, c, n, ga[buf], gb[buf], gs);
            n = next, nr = next_nr, buf ^= 1;
        }
        return;
    }
    if (NR == 4)
        for (; n + 4 <= n1; n += 4) tile_scales_zmm(f, c, n, 4, ga[0], gb[0]), rows_zmm(f, 4, c, n, ga[0], gb[0], gs);
    if (NR == 2)
        for (; n + 2 <= n1; n += 2) tile_scales_zmm(f, c, n, 2, ga[0], gb[0]), rows_zmm(f, 2, c, n, ga[0], gb[0], gs);
    for (; n < n1; n++) tile_scales_zmm(f, c, n, 1, ga[0], gb[0]), rows_zmm(f, 1, c, n, ga[0], gb[0], gs);
#else
    float a[K / 16 + 16], b[K / 16 + 16]; /* the row's scales */
#if !(RP_AVXVNNI || RP_AVX2)
    int8_t q[K];
#else
    int8_t *q = NULL;
#endif
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = c->w + n * c->row_bytes;
        row_scales(f, row, K, a, b);
#if !(RP_AVXVNNI || RP_AVX2)
        for (int64_t i = 0; i < K / fmt_qk(f); i++) block_ints(f, row + i * fmt_bytes(f), q + i * fmt_qk(f));
#endif
        const float bn = c->bias ? c->bias[n] : 0.0f;
        for (int64_t t0 = 0; t0 < T; t0 += TOKEN_TILE) {
            float out[TOKEN_TILE];
            const int nt = T - t0 < TOKEN_TILE ? (int)(T - t0) : TOKEN_TILE;
            dot_tile(f, nt, c, row, q, a, b, t0, out);
            for (int t = 0; t < nt; t++) c->y[(t0 + t) * N + n] = out[t] + bn;
        }
    }
#endif
}

#define ROW_QUANTUM 16 /* rows per unit of the split: whole cache lines of y at T = 1 */

static void matmul_task(void *arg, int ith, int nth) {
    const gguf_call *c = arg;
    int64_t n0, n1;
    rp_split(c->N, ROW_QUANTUM, ith, nth, &n0, &n1);
    switch (c->fmt) { /* one specialized copy of the loops per format */
    case GGML_Q8_0: matmul_rows(GGML_Q8_0, c, n0, n1); break;
    case GGML_Q4_0: matmul_rows(GGML_Q4_0, c, n0, n1); break;
    case GGML_Q4_1: matmul_rows(GGML_Q4_1, c, n0, n1); break;
    case GGML_Q4_K: matmul_rows(GGML_Q4_K, c, n0, n1); break;
    case GGML_Q5_K: matmul_rows(GGML_Q5_K, c, n0, n1); break;
    case GGML_Q6_K: matmul_rows(GGML_Q6_K, c, n0, n1); break;
    }
}

static int nparts(int64_t units, int nthreads) {
    int nth = nthreads < 1 ? 1 : nthreads;
    return units < nth ? (int)(units < 1 ? 1 : units) : nth;
}

/* y (T, N) = x (T, K) W^T (+ bias (N)); W (N, row_bytes) blocks of GGML type `qtype`;
 * scratch: T K + 8 T K / 32 bytes, 4-byte aligned (xq, dx, s). Returns 0, or -1 for an
 * unknown type or a K that is not whole blocks. */
RP_EXPORT int rp_gguf_matmul(int qtype, float *y, const float *x, const uint8_t *w, const float *bias, int64_t T,
                             int64_t N, int64_t K, uint8_t *scratch, int nthreads) {
    if (!known_fmt(qtype) || K <= 0 || K % fmt_qk(qtype)) return -1;
#if RP_AVX512VNNI
    pthread_once(&heads_once, make_heads_plans);
#endif
    gguf_call c = {.fmt = qtype, .y = y, .x = x, .w = w, .bias = bias, .T = T, .N = N, .K = K,
                   .row_bytes = K / fmt_qk(qtype) * fmt_bytes(qtype)};
    scratch_views(&c, scratch);
    /* quantizing is ~1/50 of the product's work: split it only when it is large */
    rp_parallel(quantize_task, &c, T * K >= (1 << 16) ? nparts(T, nthreads) : 1);
    rp_parallel(matmul_task, &c, nparts((N + ROW_QUANTUM - 1) / ROW_QUANTUM, nthreads));
    return 0;
}

/* The activation's quantization alone, into the same scratch (for the tests: it must
 * equal quantize_q8_ref exactly). */
RP_EXPORT void rp_gguf_quantize_q8(const float *x, uint8_t *scratch, int64_t T, int64_t K) {
    gguf_call c = {.x = x, .T = T, .K = K};
    scratch_views(&c, scratch);
    quantize_task(&c, 0, 1);
}

/* --- rows: a packed embedding table -------------------------------------------------- */

static void rows_task(void *arg, int ith, int nth) {
    const gguf_call *c = arg;
    const int f = c->fmt, qk = fmt_qk(f), G = fmt_group(f);
    const int64_t K = c->K;
    int64_t t0, t1;
    rp_split(c->T, 1, ith, nth, &t0, &t1);
    float a[256 / 16], b[256 / 32];
    int8_t q[256];
    for (int64_t t = t0; t < t1; t++) {
        const uint8_t *row = c->w + (int64_t)c->ids[t] * c->row_bytes;
        float *out = c->y + t * K;
        for (int64_t i = 0; i < K / qk; i++) {
            block_scales(f, row + i * fmt_bytes(f), a, b);
            block_ints(f, row + i * fmt_bytes(f), q);
            /* one rounding of a q + b: for Q4_0 (b = -8 d) that is exactly d (q - 8) */
            for (int k = 0; k < qk; k++) out[i * qk + k] = fmaf(a[k / G], (float)q[k], fmt_signed(f) ? 0.0f : b[k / 32]);
        }
    }
}

/* out (T, K) = rows ids (T) of W (N, row_bytes), dequantized. Returns 0, or -1 as above
 * (the caller checks that every id is in 0 .. N). */
RP_EXPORT int rp_gguf_rows(int qtype, float *out, const uint8_t *w, const int32_t *ids, int64_t T, int64_t N,
                           int64_t K, int nthreads) {
    if (!known_fmt(qtype) || K <= 0 || K % fmt_qk(qtype)) return -1;
    gguf_call c = {.fmt = qtype, .y = out, .w = w, .ids = ids, .T = T, .N = N, .K = K,
                   .row_bytes = K / fmt_qk(qtype) * fmt_bytes(qtype)};
    rp_parallel(rows_task, &c, T * K >= (1 << 16) ? nparts(T, nthreads) : 1);
    return 0;
}
