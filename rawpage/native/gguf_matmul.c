/* Linear layers on GGUF weights, repacked once at load into panels of 16 rows:
 *
 *     y (T, N) = x (T, K) W^T (+ bias)        float32, W (N, K) in any format of the table
 *
 * The math. Every format is, per group g of G values (G = 32 or 16), an affine map of
 * small unsigned integers (rawpage/quantization/gguf.py has the table and each decode):
 *
 *     W[n, k] = a_g (L[q_k] - offset) + b_g,    a_g = d sc_g,   b_g = -dm m_g  (mins only)
 *
 * The activation is rounded once per call to int8 per 32-value chunk c of each token
 * (quantize_row: dx = max|x| / 127, xq = rint(x / dx)), so one group's share of y is
 *
 *     a_g dx_c (sum_k L[q_k] xq_k  -  offset sum_k xq_k)   +   b_g (dx_c sum_k xq_k)
 *               \______________ exact int32 ______________/        \_ s[t, g] _/
 *
 * The integer dot starts from -offset sum xq (xo[t, g], made once per call) and adds
 * 4 products per int32 lane per instruction: vpdpbusd (unsigned weights x signed
 * activations) on AVX-512 VNNI and AVX-VNNI, maddubs + madd on AVX2 (whose int16 pairs
 * would saturate on 8-bit weights: there the 8-bit formats take signed values and the
 * sign trick, and start from 0, which is the same integer). Then per group, in group
 * order, in float32:
 *
 *     acc  = fma(float(dot), a_g * dx_c, acc),   then with mins   acc = fma(b_g, s[t, g], acc)
 *     y    = acc + bias
 *
 * Every path (zmm, ymm, plain C) makes these float operations in this order for each
 * (token, row), whatever the tile or the thread split: a token's y has the same bits
 * alone or in any batch, and on every instruction-set path. `parts` = 2 (the LM head)
 * rounds x twice: xq, then its remainder x - dx xq as a second int8 row with its own
 * scale, and y = (y_part0) + (y_part1) + bias: 15 bits of x for 2x the dot products,
 * since int8 rounding at the LM head lands in the logits directly (it flipped greedy
 * near-ties of the default model).
 *
 * The panel layout (rp_gguf_pack below writes it; native/gguf.py's repack_ref is its
 * NumPy reference, and both take their sizes from the same table). Rows are taken 16 at
 * a time (a panel; the last one padded with zero rows), and a panel stores its blocks
 * in K order, each block as
 *
 *     d    f16 [16]                 the rows' block scales
 *     dm   f16 [16]                 mins only
 *     sc   int8 [groups][16]        sub-scales (scale_bits 8)
 *     m    uint8 [groups][16]       per-group mins (scale_bits 8)
 *     scm  uint8 [groups][16]       sc | m << 4 (scale_bits 4: Q2_K), their low nibbles (6)
 *     hi   uint32 [16]              scale_bits 6 (Q4_K, Q5_K): the top two bits of each
 *                                   6-bit sc_g at bits 4 g, 4 g + 1, of m_g at 4 g + 2, 4 g + 3
 *     then each 32-value chunk's integers as planes of 64-byte "quad vectors", byte
 *     4 r + j of a quad vector holding row r's value 4 u + j of quad u of the chunk:
 *       bits 8      8 quad vectors, q as is
 *       bits 4-6    4 nibble vectors: vector v has quad v in its low nibbles, quad v + 4
 *                   in its high nibbles
 *       bits 2, 3, 6  2 two-bit vectors: vector h has bits 2i, 2i+1 = the two bits of
 *                   quad 4 h + i (bits 4-5 of q for 6-bit, bits 0-1 for 2- and 3-bit)
 *       bits 3, 5   1 one-bit vector: bit u = bit 2 (3-bit) or 4 (5-bit) of quad u
 * so one zmm load (or two ymm) gives 4 consecutive values of 16 rows, the 16 int32
 * lanes of a vpdpbusd are the 16 rows, and the activation's 4 values are one
 * broadcast. Group g's quads are 4 (G = 16) or 8 (G = 32) in a row. The bytes are
 * the file's (Q4_K and Q5_K's 6-bit scales and mins in 12 bytes a row, as in the file),
 * except Q3_K and IQ4_XS: their 6-bit scales as bytes, +3.6% and +1.5%.
 *
 * Work split: token blocks of TB (the activations' int8 rows stay in L2 while every
 * panel passes), then panels split over the threads (rp_split), then tiles of up to 8
 * tokens per panel: each quad vector is unpacked once per tile and serves its tokens
 * from registers. With few panels and many tokens, the tokens are split instead. A call
 * of up to 2 TB rows split by panels (a decode step's GEMV, a short prompt) hands its
 * panels out 4 at a time instead, each claim running its token blocks: each thread takes
 * its own share from the front and then the rest of a slower thread's from the back
 * (matmul_part; against the static split, 1B shapes, 2 threads, alternating rounds:
 * decode steps Q4_K 0.6-1.8% and Q6_K 0.9-1.8% faster at the median, a T = 96 prefill's
 * gate|up and down 0-5% in Q4_K and 3-11% in Q6_K). Each
 * tile prefetches the weight stream PREFETCH_AHEAD bytes ahead (the hardware prefetcher
 * alone left decode at 4-16 tokens waiting on memory as much as computing: 1B shapes,
 * 2 threads, T = 4 30.4 -> 24.0 ms a step, T = 8 47 -> 37, T = 128 501 -> 475).
 * The caller (native/gguf.py) passes one scratch: xq (R, K) int8, dx (R, K / 32),
 * s (R, K / G) float, xo (R, K / G) int32 with R = parts T rows.
 */
#include <math.h>
#include <stdatomic.h>

#include "common.h"

#define RP_INLINE static inline __attribute__((always_inline))
#define PANEL 16     /* rows a panel: the 16 int32 lanes of a zmm */
#define TILE 8       /* tokens of one register tile */
#define TB 64        /* tokens of one block (xq rows kept in L2) */
#define RP_STEAL_THREADS 64 /* a decode call's panels are shared out for stealing up to this many threads */
/* The software prefetch: each chunk asks for the bytes this far past its own (the
 * next 8-16 chunks). The distance depends on the page size. With the panels in 4 KiB
 * pages, 1 KB was best (1B shapes from memory, 2 threads, interleaved runs: 87-93% of
 * the plain read's bandwidth, 2-8 KB 70-85%, 64 KB and none less; an L2 hint slower).
 * In 2 MiB pages (native/huge_pages.py), where a prefetch 4 KB ahead no longer lands on
 * a page the TLB has yet to walk, 4 KB beat 1 KB: a 1B decode step's GEMVs 2-6% faster
 * in Q4_K, 4% in Q8_0, Q6_K the same, T = 4 and 8 7%, a T = 96 prefill 3% (6 runs of
 * 40-60 alternating rounds; 2 KB and 8 KB in between). -DPREFETCH_AHEAD=... to measure others. */
#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD 4096
#endif

/* --- the layout, from the traits --------------------------------------------------- */

RP_INLINE int chunk_bytes(const rp_format_traits F) {
    switch (F.bits) {
    case 8: return 512;
    case 6: return 256 + 128;
    case 5: return 256 + 64;
    case 4: return 256;
    case 3: return 128 + 64;
    default: return 128; /* 2 */
    }
}

/* The block header: d, dm, sc, m (or scm, hi). */
RP_INLINE int header_bytes(const rp_format_traits F) {
    const int groups = F.block / F.group;
    int n = 2 * PANEL + (F.mins ? 2 * PANEL : 0);
    if (F.scale_bits == 4) return n + groups * PANEL;
    if (F.scale_bits == 6) return n + groups * PANEL + 4 * PANEL;
    return n + (F.sub_scales ? groups * PANEL : 0) + (F.mins == 2 ? groups * PANEL : 0);
}

RP_INLINE int64_t panel_block_bytes(const rp_format_traits F) {
    return header_bytes(F) + (int64_t)(F.block / 32) * chunk_bytes(F);
}

RP_INLINE float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return rp_f16_to_f32(h);
}

/* --- the activation: int8 per 32-value chunk ---------------------------------------- */

/* 32 values -> xq, returns dx (0 for an all-zero chunk: xq = 0), with the reference's
 * float32 arithmetic (a true division, round half to even). */
static float quantize_chunk(const float *v, int8_t *q) {
    float amax = 0.0f;
    for (int i = 0; i < 32; i++) amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
    const float dx = amax / 127.0f;
    for (int i = 0; i < 32; i++) q[i] = dx > 0.0f ? (int8_t)rintf(v[i] / dx) : 0;
    return dx;
}

typedef struct {
    int fmt, parts;
    float *y;           /* (T, N), rows ldy floats apart (a column slice of a wider output) */
    const float *x;     /* (T, K) */
    const uint8_t *w;   /* (P, panel_bytes) */
    const float *bias;  /* (N) or NULL */
    const int32_t *ids; /* rows: (T) */
    int64_t T, N, K, R, P, panel_bytes, ldy;
    int8_t *xq;  /* (R, K), row parts t + p: token t's part p */
    float *dx;   /* (R, K / 32) */
    float *s;    /* (R, K / G) */
    int32_t *xo; /* (R, K / G) */
    /* a one-tile call's panels: each thread's range as next << 32 | end, on a line of its own */
    _Atomic uint64_t (*ranges)[8];
    int by_panels; /* the split: panels over the threads (else rows, in whole tiles) */
} gguf_call;

static void scratch_views(gguf_call *c, uint8_t *scratch, int group) {
    const int64_t R = c->R, K = c->K;
    c->xq = (int8_t *)scratch;
    c->dx = (float *)(scratch + R * K);
    c->s = c->dx + R * (K / 32);
    c->xo = (int32_t *)(c->s + R * (K / group));
}

/* Token t's rows: xq, dx of each part, then per group s = dx sum xq and
 * xo = -offset sum xq (0 on AVX2 for the 8-bit formats: their sign trick). */
static void quantize_token(const gguf_call *c, const rp_format_traits F, int64_t t) {
    const int64_t K = c->K, G = F.group;
    float rest[32];
    for (int p = 0; p < c->parts; p++) {
        const int64_t r = t * c->parts + p;
        int8_t *xq = c->xq + r * K;
        float *dx = c->dx + r * (K / 32);
        for (int64_t ch = 0; ch < K / 32; ch++) {
            const float *x = c->x + t * K + 32 * ch;
            if (p == 0) {
                dx[ch] = quantize_chunk(x, xq + 32 * ch);
            } else { /* the remainder of part 0's rounding */
                const float d0 = c->dx[(r - 1) * (K / 32) + ch];
                const int8_t *q0 = c->xq + (r - 1) * K + 32 * ch;
                for (int i = 0; i < 32; i++) rest[i] = fmaf(-d0, (float)q0[i], x[i]); /* one rounding */
                dx[ch] = quantize_chunk(rest, xq + 32 * ch);
            }
        }
        int offset = F.offset;
#if !RP_AVXVNNI && RP_AVX2
        if (F.offset == 128) offset = 0;
#endif
        for (int64_t g = 0; g < K / G; g++) {
            int32_t sum = 0;
            for (int64_t k = g * G; k < (g + 1) * G; k++) sum += xq[k];
            c->s[r * (K / G) + g] = dx[g * G / 32] * (float)sum;
            c->xo[r * (K / G) + g] = -offset * sum;
        }
    }
}

/* --- a tile: y[t0 .. t0 + NT rows of parts, panel p] ------------------------------------- */

/* Where a block's fields start. */
typedef struct {
    const uint8_t *d, *dm, *sc, *m, *hi, *planes;
} block_fields;

RP_INLINE block_fields fields_of(const rp_format_traits F, const uint8_t *blk) {
    const int groups = F.block / F.group;
    block_fields b = {blk, blk + 2 * PANEL, NULL, NULL, NULL, NULL};
    const uint8_t *p = blk + 2 * PANEL + (F.mins ? 2 * PANEL : 0);
    if (F.scale_bits == 4 || F.scale_bits == 6) {
        b.sc = b.m = p;
        p += groups * PANEL;
        if (F.scale_bits == 6) b.hi = p, p += 4 * PANEL;
    } else {
        if (F.sub_scales) b.sc = p, p += groups * PANEL;
        if (F.mins == 2) b.m = p, p += groups * PANEL;
    }
    b.planes = p;
    return b;
}

/* Row r's sc_g and m_g of group g, where they share a byte (scale_bits 4: a nibble each;
 * 6: and their top two bits from the row's word, bits 4 g .. 4 g + 3). */
RP_INLINE void packed_scale_min(const rp_format_traits F, const block_fields *b, int g, int r, int *sc, int *m) {
    const int scm = b->sc[PANEL * g + r];
    uint32_t hi = 0;
    if (F.scale_bits == 6) memcpy(&hi, b->hi + 4 * r, 4), hi >>= 4 * g;
    *sc = (scm & 15) | (int)(hi & 3) << 4, *m = (scm >> 4) | (int)(hi & 12) << 2;
}

#if RP_AVX512VNNI
/* Quad u (0..7) of a chunk's planes as 64 unsigned bytes: 16 rows x 4 values. */
RP_INLINE __m512i quad_zmm(const rp_format_traits F, const uint8_t *pl, const int u) {
    if (F.bits == 8) return _mm512_loadu_si512(pl + 64 * u);
    __m512i q;
    if (F.bits <= 3) {
        const __m512i two = _mm512_loadu_si512(pl + 64 * (u / 4));
        q = _mm512_and_si512(_mm512_srli_epi16(two, 2 * (u % 4)), _mm512_set1_epi8(3));
        if (F.bits == 3) {
            const __mmask64 hi = _mm512_test_epi8_mask(_mm512_loadu_si512(pl + 128), _mm512_set1_epi8((char)(1 << u)));
            q = _mm512_mask_add_epi8(q, hi, q, _mm512_set1_epi8(4));
        }
        return q;
    }
    const __m512i nib = _mm512_loadu_si512(pl + 64 * (u % 4));
    q = _mm512_and_si512(u < 4 ? nib : _mm512_srli_epi16(nib, 4), _mm512_set1_epi8(15));
    if (F.bits == 5) {
        const __mmask64 hi = _mm512_test_epi8_mask(_mm512_loadu_si512(pl + 256), _mm512_set1_epi8((char)(1 << u)));
        q = _mm512_mask_add_epi8(q, hi, q, _mm512_set1_epi8(16));
    } else if (F.bits == 6) { /* ((two >> 2i) & 3) << 4, as one shift and a mask */
        const __m512i two = _mm512_loadu_si512(pl + 256 + 64 * (u / 4));
        const int i = u % 4;
        const __m512i hi = i < 3 ? _mm512_slli_epi16(two, 4 - 2 * i) : _mm512_srli_epi16(two, 2);
        q = _mm512_or_si512(q, _mm512_and_si512(hi, _mm512_set1_epi8(0x30)));
    }
    if (F.lut) {
        static const unsigned char lut[16] = RP_IQ4_LUT;
        q = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)lut)), q);
    }
    return q;
}

RP_INLINE __m512 neg_zmm(__m512 v) { /* -v, exactly (-dm: the b term is -dm m) */
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), _mm512_set1_epi32((int)0x80000000)));
}

/* dot + the 4-value products of w's 16 rows with x[0..4) (4 int8 activations, one
 * dword broadcast to every lane). Written out so that the broadcast is vpdpbusd's own
 * memory operand ({1to16}): GCC keeps _mm512_set1_epi32 of a loaded dword as a separate
 * vpbroadcastd, and a tile makes one a token and quad. Measured (1B gate|up and down,
 * T = 96-128, 1 and 2 threads, alternating builds): Q4_K +3-11%, Q5_K +5-18%, Q3_K and
 * IQ4_XS +3-5%, Q6_K +1-7%, Q4_0 and Q8_0 -3 to +11% (within the noise); decode the same. */
typedef int32_t __attribute__((may_alias)) rp_dword; /* 4 int8 read as one dword */
RP_INLINE __m512i dpbusd_x(__m512i dot, __m512i w, const int8_t *x) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(dot) : "v"(w), "m"(*(const rp_dword *)x));
    return dot;
}

/* The 16 rows' a_g = d sc_g and b_g = -dm m_g for group g of the block. */
RP_INLINE void group_scales_zmm(const rp_format_traits F, const block_fields *b, int g, __m512 d, __m512 dm,
                                __m512 *a, __m512 *bm) {
    *a = d;
    if (F.scale_bits == 4 || F.scale_bits == 6) {
        const __m512i scm = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b->sc + PANEL * g)));
        __m512i sc = _mm512_and_si512(scm, _mm512_set1_epi32(15)), m = _mm512_srli_epi32(scm, 4);
        if (F.scale_bits == 6) { /* bits 4 g .. 4 g + 3 of hi: sc's top two, then m's */
            const __m512i hi = _mm512_srl_epi32(_mm512_loadu_si512(b->hi), _mm_cvtsi32_si128(4 * g));
            const __m512i top = _mm512_set1_epi32(0x30);
            sc = _mm512_or_si512(sc, _mm512_and_si512(_mm512_slli_epi32(hi, 4), top));
            m = _mm512_or_si512(m, _mm512_and_si512(_mm512_slli_epi32(hi, 2), top));
        }
        *a = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
        *bm = _mm512_mul_ps(dm, _mm512_cvtepi32_ps(m));
        return;
    }
    if (F.sub_scales)
        *a = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b->sc + PANEL * g)))));
    if (F.mins == 2)
        *bm = _mm512_mul_ps(dm, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b->m + PANEL * g)))));
    else if (F.mins == 1)
        *bm = dm;
}

/* acc of rows r0 .. r0 + NT of the activation (parts rows) for panel p. */
RP_INLINE void tile_zmm(const rp_format_traits F, const int NT, const gguf_call *c, int64_t p, int64_t r0,
                        __m512 *acc) {
    const int64_t K = c->K, G = F.group, ng = K / G, nc = K / 32;
    const int64_t pbb = panel_block_bytes(F);
    const uint8_t *blk = c->w + p * c->panel_bytes;
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t ib = 0; ib < K / F.block; ib++, blk += pbb) {
        const block_fields b = fields_of(F, blk);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)b.d));
        const __m512 dm = F.mins ? neg_zmm(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)b.dm))) : _mm512_setzero_ps();
        const uint8_t *pl = b.planes;
        for (int ch = 0; ch < F.block / 32; ch++, pl += chunk_bytes(F)) {
            /* (a prefetch past the weight's end is harmless: prefetches never fault) */
            for (int l = 0; l < chunk_bytes(F); l += 64) _mm_prefetch((const char *)(pl + PREFETCH_AHEAD + l), _MM_HINT_T0);
            const int64_t cg = ib * (F.block / 32) + ch; /* the chunk's index in the row */
#pragma GCC unroll 2
            for (int h = 0; h < 32 / G; h++) { /* the chunk's groups (unrolled: constant quads, shifts) */
                const int64_t g = cg * (32 / G) + h;
                __m512 a, bm = _mm512_setzero_ps();
                group_scales_zmm(F, &b, (int)(g % (F.block / G)), d, dm, &a, &bm);
                /* the group's integer dots, in SPLIT independent chains over its quads
                 * (one chain of 8 dependent vpdpbusd would bound a 1- or 2-token tile by
                 * their latency; measured: 2 chains beat 1 and 4 there, and past 2 tokens
                 * the tokens' chains are enough); integer sums: any split, the same dot */
                const int SPLIT = NT <= 2 ? 2 : 1;
                __m512i dot[4][TILE];
                for (int t = 0; t < NT; t++) {
                    /* (xo = -offset sum xq: 0 without an offset, and no load) */
                    dot[0][t] = F.offset ? _mm512_set1_epi32(c->xo[(r0 + t) * ng + g]) : _mm512_setzero_si512();
                    for (int k = 1; k < SPLIT; k++) dot[k][t] = _mm512_setzero_si512();
                }
#pragma GCC unroll 8
                for (int u = h * (G / 4); u < (h + 1) * (G / 4); u++) {
                    const __m512i wq = quad_zmm(F, pl, u);
                    for (int t = 0; t < NT; t++)
                        dot[u % SPLIT][t] = dpbusd_x(dot[u % SPLIT][t], wq, c->xq + (r0 + t) * K + 32 * cg + 4 * u);
                }
                for (int t = 0; t < NT; t++) {
                    for (int k = 1; k < SPLIT; k++) dot[0][t] = _mm512_add_epi32(dot[0][t], dot[k][t]);
                    const __m512 scale = _mm512_mul_ps(a, _mm512_set1_ps(c->dx[(r0 + t) * nc + cg]));
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[0][t]), scale, acc[t]);
                    if (F.mins) acc[t] = _mm512_fmadd_ps(bm, _mm512_set1_ps(c->s[(r0 + t) * ng + g]), acc[t]);
                }
            }
        }
    }
}

/* y for rows r0 .. r0 + NT of the activation (NT a multiple of parts) and panel p. */
RP_INLINE void panel_rows_zmm(const rp_format_traits F, const int NT, const gguf_call *c, int64_t p, int64_t r0) {
    __m512 acc[TILE];
    tile_zmm(F, NT, c, p, r0, acc);
    const int64_t n0 = p * PANEL;
    const __mmask16 live = c->N - n0 >= PANEL ? 0xffff : (__mmask16)((1u << (c->N - n0)) - 1);
    const __m512 bias = c->bias ? _mm512_maskz_loadu_ps(live, c->bias + n0) : _mm512_setzero_ps();
    for (int t = 0; t < NT; t += c->parts) {
        __m512 y = acc[t];
        if (c->parts == 2) y = _mm512_add_ps(y, acc[t + 1]);
        _mm512_mask_storeu_ps(c->y + ((r0 + t) / c->parts) * c->ldy + n0, live, _mm512_add_ps(y, bias));
    }
}
#define PANEL_ROWS(NT) panel_rows_zmm(F, NT, c, p, r0)

#else /* the ymm paths and plain C: a panel as two halves of 8 rows, or one row at a time */

/* Row r's value k (0..31) of a chunk's planes, as the unsigned integer q. */
RP_INLINE int quad_value(const rp_format_traits F, const uint8_t *pl, int r, int k) {
    const int u = k / 4, byte = 4 * r + k % 4;
    if (F.bits == 8) return pl[64 * u + byte];
    if (F.bits <= 3) {
        int q = (pl[64 * (u / 4) + byte] >> (2 * (u % 4))) & 3;
        if (F.bits == 3) q |= ((pl[128 + byte] >> u) & 1) << 2;
        return q;
    }
    int q = (pl[64 * (u % 4) + byte] >> (u < 4 ? 0 : 4)) & 15;
    if (F.bits == 5) q |= ((pl[256 + byte] >> u) & 1) << 4;
    if (F.bits == 6) q |= ((pl[256 + 64 * (u / 4) + byte] >> (2 * (u % 4))) & 3) << 4;
    return q;
}

/* Row r's a_g and b_g (-dm m_g) of group g of the block. */
RP_INLINE void group_scales_row(const rp_format_traits F, const block_fields *b, int g, int r, float *a, float *bm) {
    const float d = f16_at(b->d + 2 * r), dm = F.mins ? -f16_at(b->dm + 2 * r) : 0.0f;
    *a = d, *bm = 0.0f;
    if (F.scale_bits == 4 || F.scale_bits == 6) {
        int sc, m;
        packed_scale_min(F, b, g, r, &sc, &m);
        *a = d * (float)sc, *bm = dm * (float)m;
        return;
    }
    if (F.sub_scales) *a = d * (float)(int8_t)b->sc[PANEL * g + r];
    if (F.mins == 2) *bm = dm * (float)b->m[PANEL * g + r];
    else if (F.mins == 1) *bm = dm;
}
#endif

#if !RP_AVX512VNNI && (RP_AVXVNNI || RP_AVX2)
/* Quad u of a chunk's planes, rows 8 h .. 8 h + 8, as 32 bytes: unsigned q; for the
 * 8-bit formats on AVX2, the signed value L[q] - 128 (the sign trick below). */
RP_INLINE __m256i quad_ymm(const rp_format_traits F, const uint8_t *pl, const int u, const int half) {
    const int o = 32 * half;
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256i q;
    if (F.bits == 8) {
        q = _mm256_loadu_si256((const __m256i *)(pl + 64 * u + o));
    } else if (F.bits <= 3) {
        const __m256i two = _mm256_loadu_si256((const __m256i *)(pl + 64 * (u / 4) + o));
        q = _mm256_and_si256(_mm256_srli_epi16(two, 2 * (u % 4)), _mm256_set1_epi8(3));
        if (F.bits == 3) {
            const __m256i bit = _mm256_set1_epi8((char)(1 << u));
            const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)(pl + 128 + o)), bit), bit);
            q = _mm256_or_si256(q, _mm256_and_si256(set, _mm256_set1_epi8(4)));
        }
    } else {
        const __m256i nib = _mm256_loadu_si256((const __m256i *)(pl + 64 * (u % 4) + o));
        q = _mm256_and_si256(u < 4 ? nib : _mm256_srli_epi16(nib, 4), m4);
        if (F.bits == 5) {
            const __m256i bit = _mm256_set1_epi8((char)(1 << u));
            const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)(pl + 256 + o)), bit), bit);
            q = _mm256_or_si256(q, _mm256_and_si256(set, _mm256_set1_epi8(16)));
        } else if (F.bits == 6) {
            const __m256i two = _mm256_loadu_si256((const __m256i *)(pl + 256 + 64 * (u / 4) + o));
            const int i = u % 4;
            const __m256i hi = i < 3 ? _mm256_slli_epi16(two, 4 - 2 * i) : _mm256_srli_epi16(two, 2);
            q = _mm256_or_si256(q, _mm256_and_si256(hi, _mm256_set1_epi8(0x30)));
        }
        if (F.lut) {
            static const unsigned char lut[16] = RP_IQ4_LUT;
            q = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)lut)), q);
        }
    }
#if !RP_AVXVNNI
    if (F.offset == 128) q = _mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)); /* L[q] - 128, signed */
#endif
    return q;
}

/* dot + 4-value dot products of w and x per int32 lane. */
RP_INLINE __m256i dot_ymm(const rp_format_traits F, __m256i dot, __m256i w, __m256i x) {
#if RP_AVXVNNI && defined(__AVXVNNI__)
    (void)F;
    return _mm256_dpbusd_avx_epi32(dot, w, x);
#elif RP_AVXVNNI
    (void)F;
    return _mm256_dpbusd_epi32(dot, w, x);
#else
    /* maddubs' int16 pairs: |u| <= 128 and |s| <= 127 keep them in range: q <= 63 as
     * is, the 8-bit formats as |v| and x with v's sign */
    if (F.offset == 128) x = _mm256_sign_epi8(x, w), w = _mm256_abs_epi8(w);
    return _mm256_add_epi32(dot, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
#endif
}

/* The 8 rows' a_g and b_g (see group_scales_row) of half h. */
RP_INLINE void group_scales_ymm(const rp_format_traits F, const block_fields *b, int g, int half, __m256 *a, __m256 *bm) {
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b->d + 16 * half)));
    const __m256 dm = F.mins ? _mm256_xor_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b->dm + 16 * half))),
                                             _mm256_set1_ps(-0.0f)) /* -dm, exactly */
                             : _mm256_setzero_ps();
    const uint8_t *sc = b->sc ? b->sc + PANEL * g + 8 * half : NULL, *m = b->m ? b->m + PANEL * g + 8 * half : NULL;
    *a = d, *bm = _mm256_setzero_ps();
    if (F.scale_bits == 4 || F.scale_bits == 6) {
        const __m256i scm = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sc));
        __m256i s = _mm256_and_si256(scm, _mm256_set1_epi32(15)), mg = _mm256_srli_epi32(scm, 4);
        if (F.scale_bits == 6) { /* as group_scales_zmm */
            const __m256i hi = _mm256_srl_epi32(_mm256_loadu_si256((const __m256i *)(b->hi + 32 * half)),
                                                _mm_cvtsi32_si128(4 * g));
            const __m256i top = _mm256_set1_epi32(0x30);
            s = _mm256_or_si256(s, _mm256_and_si256(_mm256_slli_epi32(hi, 4), top));
            mg = _mm256_or_si256(mg, _mm256_and_si256(_mm256_slli_epi32(hi, 2), top));
        }
        *a = _mm256_mul_ps(d, _mm256_cvtepi32_ps(s));
        *bm = _mm256_mul_ps(dm, _mm256_cvtepi32_ps(mg));
        return;
    }
    if (F.sub_scales) *a = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)sc))));
    if (F.mins == 2) *bm = _mm256_mul_ps(dm, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)m))));
    else if (F.mins == 1) *bm = dm;
}

RP_INLINE void panel_rows_ymm(const rp_format_traits F, const int NT, const gguf_call *c, int64_t p, int64_t r0) {
    const int64_t K = c->K, G = F.group, ng = K / G, nc = K / 32, pbb = panel_block_bytes(F);
    for (int half = 0; half < 2; half++) {
        __m256 acc[TILE];
        for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
        const uint8_t *blk = c->w + p * c->panel_bytes;
        for (int64_t ib = 0; ib < K / F.block; ib++, blk += pbb) {
            const block_fields b = fields_of(F, blk);
            const uint8_t *pl = b.planes;
            for (int ch = 0; ch < F.block / 32; ch++, pl += chunk_bytes(F)) {
                const int64_t cg = ib * (F.block / 32) + ch;
#pragma GCC unroll 2
                for (int h = 0; h < 32 / G; h++) {
                    const int64_t g = cg * (32 / G) + h;
                    __m256 a, bm;
                    group_scales_ymm(F, &b, (int)(g % (F.block / G)), half, &a, &bm);
                    __m256i dot[TILE];
                    for (int t = 0; t < NT; t++) dot[t] = _mm256_set1_epi32(c->xo[(r0 + t) * ng + g]);
#pragma GCC unroll 8
                    for (int u = h * (G / 4); u < (h + 1) * (G / 4); u++) {
                        const __m256i wq = quad_ymm(F, pl, u, half);
                        for (int t = 0; t < NT; t++) {
                            int32_t xv;
                            memcpy(&xv, c->xq + (r0 + t) * K + 32 * cg + 4 * u, 4);
                            dot[t] = dot_ymm(F, dot[t], wq, _mm256_set1_epi32(xv));
                        }
                    }
                    for (int t = 0; t < NT; t++) {
                        const __m256 scale = _mm256_mul_ps(a, _mm256_set1_ps(c->dx[(r0 + t) * nc + cg]));
                        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[t]), scale, acc[t]);
                        if (F.mins) acc[t] = _mm256_fmadd_ps(bm, _mm256_set1_ps(c->s[(r0 + t) * ng + g]), acc[t]);
                    }
                }
            }
        }
        const int64_t n0 = p * PANEL + 8 * half;
        for (int t = 0; t < NT; t += c->parts) {
            float y[8], y1[8];
            _mm256_storeu_ps(y, acc[t]);
            if (c->parts == 2) _mm256_storeu_ps(y1, acc[t + 1]);
            for (int i = 0; i < 8 && n0 + i < c->N; i++)
                c->y[((r0 + t) / c->parts) * c->ldy + n0 + i] =
                    (c->parts == 2 ? y[i] + y1[i] : y[i]) + (c->bias ? c->bias[n0 + i] : 0.0f);
        }
    }
}
#define PANEL_ROWS(NT) panel_rows_ymm(F, NT, c, p, r0)

#elif !RP_AVX512VNNI
/* Plain C: defines the result, one (row, token) at a time in the same float order. */
RP_INLINE void panel_rows_c(const rp_format_traits F, const int NT, const gguf_call *c, int64_t p, int64_t r0) {
    const int64_t K = c->K, G = F.group, ng = K / G, nc = K / 32, pbb = panel_block_bytes(F);
    static const unsigned char lut[16] = RP_IQ4_LUT;
    for (int r = 0; r < PANEL && p * PANEL + r < c->N; r++) {
        const int64_t n = p * PANEL + r;
        for (int t = 0; t < NT; t += c->parts) {
            float y = 0.0f;
            for (int part = 0; part < c->parts; part++) {
                const int64_t row = r0 + t + part;
                float acc = 0.0f;
                const uint8_t *blk = c->w + p * c->panel_bytes;
                for (int64_t ib = 0; ib < K / F.block; ib++, blk += pbb) {
                    const block_fields b = fields_of(F, blk);
                    const uint8_t *pl = b.planes;
                    for (int ch = 0; ch < F.block / 32; ch++, pl += chunk_bytes(F)) {
                        const int64_t cg = ib * (F.block / 32) + ch;
                        for (int h = 0; h < 32 / G; h++) {
                            const int64_t g = cg * (32 / G) + h;
                            float a, bm;
                            group_scales_row(F, &b, (int)(g % (F.block / G)), r, &a, &bm);
                            int32_t dot = c->xo[row * ng + g];
                            for (int k = h * G; k < (h + 1) * G; k++) {
                                const int q = quad_value(F, pl, r, k);
                                dot += (F.lut ? lut[q] : q) * c->xq[row * K + 32 * cg + k];
                            }
                            acc = fmaf((float)dot, a * c->dx[row * nc + cg], acc);
                            if (F.mins) acc = fmaf(bm, c->s[row * ng + g], acc);
                        }
                    }
                }
                y = part ? y + acc : acc;
            }
            c->y[((r0 + t) / c->parts) * c->ldy + n] = y + (c->bias ? c->bias[n] : 0.0f);
        }
    }
}
#define PANEL_ROWS(NT) panel_rows_c(F, NT, c, p, r0)
#endif

/* Panels [p0, p1) for activation rows [q0, q1), in token blocks, then tiles. */
RP_INLINE void matmul_range(const rp_format_traits F, const gguf_call *c, int64_t p0, int64_t p1, int64_t q0,
                            int64_t q1) {
    for (int64_t b0 = q0; b0 < q1; b0 += TB) {
        const int64_t b1 = b0 + TB < q1 ? b0 + TB : q1;
        for (int64_t p = p0; p < p1; p++)
            for (int64_t r0 = b0; r0 < b1;) { /* tiles of 8, then 4, 2, 1: a constant size a case */
                const int64_t left = b1 - r0;
                if (left >= 8) PANEL_ROWS(8), r0 += 8;
                else if (left >= 4) PANEL_ROWS(4), r0 += 4;
                else if (left >= 2) PANEL_ROWS(2), r0 += 2;
                else PANEL_ROWS(1), r0 += 1;
            }
    }
}

/* Take up to STEAL panels [*p0, *p1) of range r: from its front (its owner), or from its
 * back (a thread done with its own share, which leaves the owner its last STEAL). Returns
 * 0 when there are none to take. */
#define STEAL 4
/* Calls of up to this many rows share their panels out (decode steps, short prompts): a
 * claim runs its token blocks over its own 4 panels, so that past two token blocks every
 * claim would read all of xq again (1B's down at T = 2048: 0.91x of the static split). */
#define STEAL_ROWS (2 * TB)
static int take_panels(_Atomic uint64_t *r, int own, int64_t *p0, int64_t *p1) {
    uint64_t v = atomic_load_explicit(r, memory_order_relaxed);
    for (;;) {
        const int64_t next = (int64_t)(v >> 32), end = (int64_t)(v & 0xffffffffu);
        if (end - next <= (own ? 0 : STEAL)) return 0;
        *p0 = own ? next : end - STEAL;
        *p1 = own ? (next + STEAL < end ? next + STEAL : end) : end;
        const uint64_t want = own ? (uint64_t)*p1 << 32 | (uint64_t)end : (uint64_t)next << 32 | (uint64_t)*p0;
        if (atomic_compare_exchange_weak_explicit(r, &v, want, memory_order_relaxed, memory_order_relaxed)) return 1;
    }
}

/* The split: panels over the threads, or (few panels, many rows) rows in whole tiles.
 * A call of up to STEAL_ROWS rows split by panels takes them STEAL at a time: each thread
 * walks its own share front to back, then takes from the back of a slower thread's (in a
 * decode step the last part used to end 3-7% of a call after the first;
 * docs/benchmarks.md). Which thread computes a panel does not change its bits. */
RP_INLINE void matmul_part(const rp_format_traits F, const gguf_call *c, int ith, int nth) {
    int64_t p0 = 0, p1 = c->P, q0 = 0, q1 = c->R;
    if (c->ranges) {
        for (int k = 0; k < nth; k++) {
            const int v = (ith + k) % nth; /* own share first, then the others' */
            for (int64_t a, b; take_panels(&c->ranges[v][0], k == 0, &a, &b);) matmul_range(F, c, a, b, 0, c->R);
        }
        return;
    }
    if (c->by_panels) rp_split(c->P, 1, ith, nth, &p0, &p1);
    else rp_split(c->R, TILE, ith, nth, &q0, &q1); /* TILE is even: a token's parts stay together */
    matmul_range(F, c, p0, p1, q0, q1);
}

static void matmul_task(void *arg, int ith, int nth) {
    const gguf_call *c = arg;
    switch (c->fmt) { /* one specialized copy of the loops per format */
#define RUN(name, id, traits) \
    case id: matmul_part(traits, c, ith, nth); break;
        RP_GGUF_FORMATS(RUN)
#undef RUN
    }
}

static void quantize_task(void *arg, int ith, int nth) {
    const gguf_call *c = arg;
    int64_t t0, t1;
    rp_split(c->T, 1, ith, nth, &t0, &t1);
    switch (c->fmt) {
#define RUN(name, id, traits) \
    case id: for (int64_t t = t0; t < t1; t++) quantize_token(c, traits, t); break;
        RP_GGUF_FORMATS(RUN)
#undef RUN
    }
}

/* The format's traits, or a zero block size for an unknown type. */
static rp_format_traits traits_of(int qtype) {
    switch (qtype) {
#define RUN(name, id, traits) \
    case id: return traits;
        RP_GGUF_FORMATS(RUN)
#undef RUN
    }
    return (rp_format_traits){0};
}

static int nparts(int64_t units, int nthreads) {
    int nth = nthreads < 1 ? 1 : nthreads;
    return units < nth ? (int)(units < 1 ? 1 : units) : nth;
}

/* Bytes of the scratch rp_gguf_matmul takes (-1 for an unknown type). */
RP_EXPORT int64_t rp_gguf_scratch_bytes(int qtype, int64_t T, int64_t K, int parts) {
    const rp_format_traits F = traits_of(qtype);
    if (!F.block) return -1;
    const int64_t R = T * parts;
    return R * K + 4 * R * (K / 32) + 8 * R * (K / F.group);
}

/* Bytes of one panel of a (N, K) weight of this type (-1 for an unknown type). */
RP_EXPORT int64_t rp_gguf_panel_bytes(int qtype, int64_t K) {
    const rp_format_traits F = traits_of(qtype);
    if (!F.block || K % F.block) return -1;
    return K / F.block * panel_block_bytes(F);
}

/* y (T, N) = x (T, K) W^T (+ bias (N)), W the panels of a (N, K) weight of GGML type
 * `qtype`, y's rows ldy >= N floats apart (a fused layer's parts write their columns of
 * one output); parts 1 or 2 (x rounded once or twice); scratch: rp_gguf_scratch_bytes,
 * 4-byte aligned. Returns 0, or -1 for an unknown type, a K that is not whole blocks
 * or a bad `parts`. */
RP_EXPORT int rp_gguf_matmul(int qtype, float *y, int64_t ldy, const float *x, const uint8_t *w, const float *bias,
                             int64_t T, int64_t N, int64_t K, int parts, uint8_t *scratch, int nthreads) {
    const rp_format_traits F = traits_of(qtype);
    if (!F.block || K <= 0 || K % F.block || (parts != 1 && parts != 2) || ldy < N) return -1;
    gguf_call c = {.fmt = qtype, .parts = parts, .y = y, .x = x, .w = w, .bias = bias, .T = T, .N = N, .K = K,
                   .R = T * parts, .P = (N + PANEL - 1) / PANEL, .panel_bytes = K / F.block * panel_block_bytes(F),
                   .ldy = ldy};
    scratch_views(&c, scratch, F.group);
    /* quantizing is ~1/50 of the product's work: split it only when it is large */
    rp_parallel(quantize_task, &c, T * K >= (1 << 16) ? nparts(T, nthreads) : 1);
    const int nth = nparts(c.P * ((c.R + TILE - 1) / TILE), nthreads);
    _Atomic uint64_t ranges[RP_STEAL_THREADS][8];
    c.by_panels = c.P >= 4 * nth || c.R < 2 * TILE * nth;
    if (c.by_panels && c.R <= STEAL_ROWS && nth > 1 && nth <= RP_STEAL_THREADS && c.P < ((int64_t)1 << 31)) {
        for (int i = 0; i < nth; i++) { /* share i: panels rp_split gives part i, rounded to STEAL */
            int64_t a, b;
            rp_split((c.P + STEAL - 1) / STEAL, 1, i, nth, &a, &b);
            a *= STEAL, b = b * STEAL < c.P ? b * STEAL : c.P;
            atomic_init(&ranges[i][0], (uint64_t)a << 32 | (uint64_t)b);
        }
        c.ranges = ranges;
    }
    rp_parallel(matmul_task, &c, nth);
    return 0;
}

/* The activation's rounding alone, into the same scratch (for the tests). */
RP_EXPORT int rp_gguf_quantize(int qtype, const float *x, int64_t T, int64_t K, int parts, uint8_t *scratch) {
    const rp_format_traits F = traits_of(qtype);
    if (!F.block || K % F.block || (parts != 1 && parts != 2)) return -1;
    gguf_call c = {.fmt = qtype, .parts = parts, .x = x, .T = T, .K = K, .R = T * parts};
    scratch_views(&c, scratch, F.group);
    quantize_task(&c, 0, 1);
    return 0;
}

/* --- the repack: panels from each block's canonical form ------------------------------ */

/* The canonical form of rows [0, N) (rawpage/quantization/gguf.py Blocks, decoded in
 * NumPy, a format's one definition): per row and block d, dm (float32, as the file's
 * halves), sc (int8) and m (uint8) per group, q (uint8) per value. */
typedef struct {
    int fmt;
    uint8_t *out;
    const float *d, *dm;  /* (N, nb) */
    const int8_t *sc;     /* (N, nb, groups) or NULL */
    const uint8_t *m, *q; /* (N, nb, groups) or NULL; (N, nb, block) */
    int64_t N, K, P, panel_bytes;
} pack_args;

static void put_f16(uint8_t *p, float v) {
    const uint16_t h = rp_f32_to_f16(v); /* exact: v came from a half */
    memcpy(p, &h, 2);
}

/* Panel p's block ib, as gguf_matmul.c's header draws it. */
RP_INLINE void pack_block(const rp_format_traits F, const pack_args *a, int64_t p, int64_t ib, uint8_t *blk) {
    const int groups = F.block / F.group, nb = (int)(a->K / F.block);
    const int nr = a->N - p * PANEL < PANEL ? (int)(a->N - p * PANEL) : PANEL; /* rows past N stay zero */
    const block_fields b = fields_of(F, blk);
    for (int r = 0; r < nr; r++) {
        const int64_t rb = (p * PANEL + r) * nb + ib; /* the row's block, in the canonical arrays */
        put_f16((uint8_t *)b.d + 2 * r, a->d[rb]);
        if (F.mins) put_f16((uint8_t *)b.dm + 2 * r, a->dm[rb]);
        uint32_t hi = 0; /* scale_bits 6: the top bits (the header's hi) */
        for (int g = 0; g < groups; g++) {
            uint8_t *sc = (uint8_t *)b.sc, *m = (uint8_t *)b.m;
            const int s = a->sc ? (uint8_t)a->sc[rb * groups + g] : 0, mg = a->m ? a->m[rb * groups + g] : 0;
            if (F.scale_bits == 4 || F.scale_bits == 6) {
                sc[PANEL * g + r] = (uint8_t)((s & 15) | (mg & 15) << 4);
                if (F.scale_bits == 6) hi |= (uint32_t)((s >> 4) | (mg >> 4) << 2) << (4 * g);
            } else {
                if (F.sub_scales) sc[PANEL * g + r] = (uint8_t)s;
                if (F.mins == 2) m[PANEL * g + r] = (uint8_t)mg;
            }
        }
        if (F.scale_bits == 6) memcpy((uint8_t *)b.hi + 4 * r, &hi, 4);
        /* each chunk's 32 values as 8 words of one quad (4 values) each, and the planes'
         * words of row r from them (the byte layouts: gguf_matmul.c's header) */
        for (int ch = 0; ch < F.block / 32; ch++) {
            uint8_t *pl = (uint8_t *)b.planes + ch * chunk_bytes(F);
            uint32_t w[8], out;
            memcpy(w, a->q + rb * F.block + 32 * ch, 32);
            if (F.bits == 8)
                for (int u = 0; u < 8; u++) memcpy(pl + 64 * u + 4 * r, &w[u], 4);
            if (F.bits >= 4 && F.bits <= 6)
                for (int v = 0; v < 4; v++) {
                    out = (w[v] & 0x0F0F0F0Fu) | ((w[v + 4] & 0x0F0F0F0Fu) << 4);
                    memcpy(pl + 64 * v + 4 * r, &out, 4);
                }
            if (F.bits == 2 || F.bits == 3 || F.bits == 6) /* two bits: 4-5 (6-bit) or 0-1, of 4 quads */
                for (int h = 0; h < 2; h++) {
                    out = 0;
                    for (int i = 0; i < 4; i++) out |= ((w[4 * h + i] >> (F.bits == 6 ? 4 : 0)) & 0x03030303u) << (2 * i);
                    memcpy(pl + (F.bits == 6 ? 256 : 0) + 64 * h + 4 * r, &out, 4);
                }
            if (F.bits == 3 || F.bits == 5) { /* one bit: 2 (3-bit) or 4 (5-bit), of 8 quads */
                out = 0;
                for (int u = 0; u < 8; u++) out |= ((w[u] >> (F.bits == 3 ? 2 : 4)) & 0x01010101u) << u;
                memcpy(pl + (F.bits == 3 ? 128 : 256) + 4 * r, &out, 4);
            }
        }
    }
}

RP_INLINE void pack_panels(const rp_format_traits F, const pack_args *a, int64_t p0, int64_t p1) {
    const int64_t pbb = panel_block_bytes(F);
    for (int64_t p = p0; p < p1; p++) {
        uint8_t *panel = a->out + p * a->panel_bytes;
        memset(panel, 0, (size_t)a->panel_bytes);
        for (int64_t ib = 0; ib < a->K / F.block; ib++) pack_block(F, a, p, ib, panel + ib * pbb);
    }
}

static void pack_task(void *arg, int ith, int nth) {
    const pack_args *a = arg;
    int64_t p0, p1;
    rp_split(a->P, 1, ith, nth, &p0, &p1);
    switch (a->fmt) {
#define RUN(name, id, traits) \
    case id: pack_panels(traits, a, p0, p1); break;
        RP_GGUF_FORMATS(RUN)
#undef RUN
    }
}

/* out (ceil(N / 16), panel bytes) = the panels of rows [0, N) of a (N, K) weight of
 * GGML type `qtype`, from their canonical form. Returns 0, or -1 as rp_gguf_matmul. */
RP_EXPORT int rp_gguf_pack(int qtype, uint8_t *out, const float *d, const float *dm, const int8_t *sc, const uint8_t *m,
                           const uint8_t *q, int64_t N, int64_t K, int nthreads) {
    const rp_format_traits F = traits_of(qtype);
    if (!F.block || K <= 0 || K % F.block) return -1;
    pack_args a = {.fmt = qtype, .out = out, .d = d, .dm = dm, .sc = sc, .m = m, .q = q, .N = N, .K = K,
                   .P = (N + PANEL - 1) / PANEL, .panel_bytes = K / F.block * panel_block_bytes(F)};
    rp_parallel(pack_task, &a, nparts(a.P, nthreads));
    return 0;
}

/* --- rows: a packed embedding table ------------------------------------------------ */

/* Row n of the weight, dequantized: w = (L[q] - offset) a_g + b_g, as the reference. */
RP_INLINE void row_values(const rp_format_traits F, const gguf_call *c, int64_t n, float *out) {
    static const unsigned char lut[16] = RP_IQ4_LUT;
    const int64_t pbb = panel_block_bytes(F);
    const int r = (int)(n % PANEL);
    const uint8_t *blk = c->w + (n / PANEL) * c->panel_bytes;
    for (int64_t ib = 0; ib < c->K / F.block; ib++, blk += pbb) {
        const block_fields b = fields_of(F, blk);
        const float d = f16_at(b.d + 2 * r), dm = F.mins ? f16_at(b.dm + 2 * r) : 0.0f;
        for (int k = 0; k < F.block; k++) {
            const int g = k / F.group, byte = 4 * r + k % 4, u = (k % 32) / 4;
            const uint8_t *pl = b.planes + (k / 32) * chunk_bytes(F);
            int q;
            if (F.bits == 8) q = pl[64 * u + byte];
            else if (F.bits <= 3) q = ((pl[64 * (u / 4) + byte] >> (2 * (u % 4))) & 3) | (F.bits == 3 ? ((pl[128 + byte] >> u) & 1) << 2 : 0);
            else {
                q = (pl[64 * (u % 4) + byte] >> (u < 4 ? 0 : 4)) & 15;
                if (F.bits == 5) q |= ((pl[256 + byte] >> u) & 1) << 4;
                if (F.bits == 6) q |= ((pl[256 + 64 * (u / 4) + byte] >> (2 * (u % 4))) & 3) << 4;
            }
            float a = d, m = 1.0f;
            if (F.scale_bits == 4 || F.scale_bits == 6) {
                int sc, mg;
                packed_scale_min(F, &b, g, r, &sc, &mg);
                a = d * (float)sc, m = (float)mg;
            } else {
                if (F.sub_scales) a = d * (float)(int8_t)b.sc[PANEL * g + r];
                if (F.mins == 2) m = (float)b.m[PANEL * g + r];
            }
            const float v = (float)((F.lut ? lut[q] : q) - F.offset) * a;
            volatile float dmm = dm * m; /* rounded on its own, as the reference: not fused into the subtraction */
            out[ib * F.block + k] = F.mins ? v - dmm : v;
        }
    }
}

static void rows_task(void *arg, int ith, int nth) {
    const gguf_call *c = arg;
    int64_t t0, t1;
    rp_split(c->T, 1, ith, nth, &t0, &t1);
    switch (c->fmt) {
#define RUN(name, id, traits) \
    case id: for (int64_t t = t0; t < t1; t++) row_values(traits, c, c->ids[t], c->y + t * c->K); break;
        RP_GGUF_FORMATS(RUN)
#undef RUN
    }
}

/* out (T, K) = rows ids (T) of the weight (its panels), dequantized. Returns 0, or -1
 * as above (the caller checks that every id is in 0 .. N). */
RP_EXPORT int rp_gguf_rows(int qtype, float *out, const uint8_t *w, const int32_t *ids, int64_t T, int64_t N,
                           int64_t K, int nthreads) {
    const rp_format_traits F = traits_of(qtype);
    if (!F.block || K <= 0 || K % F.block) return -1;
    gguf_call c = {.fmt = qtype, .y = out, .w = w, .ids = ids, .T = T, .N = N, .K = K,
                   .panel_bytes = K / F.block * panel_block_bytes(F)};
    rp_parallel(rows_task, &c, T * K >= (1 << 16) ? nparts(T, nthreads) : 1);
    return 0;
}
