/* Paged attention on the CPU: a whole batch of decodes and prefill chunks in one
 * call, K and V read straight from the block pool through the block table.
 *
 * Math (FlashAttention's notation). Sequence i owns query rows
 * q[query_start_loc[i] .. query_start_loc[i+1]), the LAST n_i positions of its
 * context of L_i = seq_lens[i] tokens; key j of the context sits in block
 * block_tables[i, j / BS] at offset j % BS. Query head h reads KV head h / G,
 * G = H / Hkv. For a query at position p:
 *
 *     s_j = scale q.k_j                  keys j = max(0, p - W + 1) .. p (causal; W = sliding window)
 *     s_j = c tanh(s_j / c)              with a soft cap c
 *     o   = sum_j exp(s_j - m) v_j / l,  m = max_j s_j, l = sum_j exp(s_j - m)
 *
 * in one pass over the keys, Bc at a time (a chunk), with an online softmax: per
 * query row the running max m, the running sum l and the accumulator
 * acc = sum_j exp(s_j - m) v_j; a chunk with a larger max m' rescales l and acc
 * by alpha = exp(m - m') first.
 *
 * Layout of every pointer:
 *     out              [T, H, D]             float32, contiguous
 *     q                [T, q_stride]         float32; head h of token t at q + t q_stride + h D
 *                                            (a view into the fused qkv output needs no copy)
 *     k_cache, v_cache [NB, BS, Hkv, D]      float32 (kv_dtype 0) or IEEE float16 (kv_dtype 1)
 *     block_tables     [B, max_blocks]       int32
 *     seq_lens         [B]                   int32, context length including this step's tokens
 *     query_start_loc  [B + 1]               int32
 *
 * Work split: an item is one tile, (sequence, KV head, up to 32 query rows): the
 * rows are a few consecutive queries of the sequence times all G query heads of
 * that KV head (for a decode: its G heads), so each K/V row a tile reads from the
 * pool serves all of them. A tile whose keys cross a cut position is also cut
 * there into parts (flash-decoding): a part keeps (m, l, acc) of its keys, and the
 * thread that finishes a tile's last part merges them. The cut positions are 128,
 * 256, 384, then the multiples of 512: the fine ones so that a decode of a short
 * context still splits evenly (a lone decode of the default model is Hkv = 3 tiles:
 * uncut, one of 2 threads did two of them while the other idled a third of the
 * call; cut, a context of 129-511 keys is 6-12 parts), the coarse ones so that a
 * long context does not pay a part's fixed cost (the partial's write and merge,
 * ~0.2 us) every 128 keys. The cuts sit at fixed key positions, and a part's chunks
 * of Bc start at its first key, so a query row's arithmetic depends on its own
 * sequence only: not on the batch beside it, the chunk it came in, nor the thread
 * count (a sequence decodes the same tokens alone or batched; tests/test_engine.py's
 * batch invariance). Items go to the pool's threads costliest first (cost = rows x
 * keys), each thread taking the next one left, so a thread the OS slows down takes
 * fewer.
 *
 * Memory: a tile reads its head's D values of each key, Hkv D apart in the pool, so it
 * asks for the next chunk's K and V rows into L2 while it computes this one
 * (prefetch_chunk). Measured on the 2-core development VM (tools/bench_cpu_attention.py
 * --shape 1b, float32 K/V from memory): a decode at 1,024 keys 400 -> 200-280 us a
 * layer, 16 decodes at 160 keys 0.84 -> 0.65 ms; two chunks ahead was no better, and
 * into L1 no better than none.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "common.h"
#include "vec_math.h"

#define RP_ATTN_MAX_D 256
#define RP_ATTN_ROWS 32      /* query rows (queries x heads) one tile holds */
#define RP_ATTN_BC 64        /* keys per chunk (Bc) */
#define RP_ATTN_PART 512      /* keys are cut into parts at the multiples of this position, */
#define RP_ATTN_PART_NEAR 128 /* and of this one below RP_ATTN_PART */
#ifndef RP_ATTN_AHEAD
#define RP_ATTN_AHEAD 1 /* chunks a tile's K/V prefetch runs ahead */
#endif

enum { RP_KV_F32 = 0, RP_KV_F16 = 1 };

typedef struct {
    int32_t seq, kh;    /* sequence, KV head */
    int32_t g0, ng;     /* its query heads kh G + g0 .. + ng */
    int32_t q0, nq;     /* the sequence's queries q0 .. q0 + nq (0 = its first new token) */
    int32_t k0, k1;     /* key positions [k0, k1) this item reads */
    int32_t slot;       /* -1: writes out; else its partial (m, l, acc) slot */
    int32_t tile_parts; /* parts its tile was cut into */
    int32_t first_slot; /* its tile's first part's slot (the merge reads slots first_slot ..) */
    int32_t tile;       /* its tile's index: parts_left[tile] */
    int64_t cost;
} attn_item;

typedef struct {
    float *out;
    const float *q;
    int64_t q_stride;
    const void *k_cache, *v_cache;
    int kv_dtype;
    const int32_t *block_tables, *seq_lens, *query_start_loc;
    int max_blocks, H, Hkv, D, BS, window;
    float scale, soft_cap;
    const attn_item *items;
    int n_items;
    float *part_acc; /* [slots, ROWS, D] */
    float *part_ml;  /* [slots, ROWS, 2]: m, l */
    atomic_int *parts_left; /* [tiles] parts of each cut tile not yet done */
    atomic_int next;
} attn_args;

/* S[c RP + r] = cap tanh(S / cap), in place */
static void soft_cap_scores(float *S, int n, float cap) {
    int i = 0;
#if defined(RP_AVX512VNNI)
    __m512 c = _mm512_set1_ps(cap), inv = _mm512_set1_ps(1.0f / cap);
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(S + i, _mm512_mul_ps(c, rp_tanh16(_mm512_mul_ps(_mm512_loadu_ps(S + i), inv))));
#elif defined(RP_AVX2)
    __m256 c = _mm256_set1_ps(cap), inv = _mm256_set1_ps(1.0f / cap);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(S + i, _mm256_mul_ps(c, rp_tanh8(_mm256_mul_ps(_mm256_loadu_ps(S + i), inv))));
#endif
    for (; i < n; i++) S[i] = cap * tanhf(S[i] / cap);
}

/* The online softmax over one chunk, vectorized over the RP rows (S is [nc, RP]):
 *     m' = max(m, max_c S[c]),  P[c] = exp(S[c] - m'),  alpha = exp(m - m'),  l = alpha l + sum_c P[c]
 * P overwrites S. A row that has seen no visible key yet keeps m = -inf; it
 * subtracts 0 instead, so that exp(-inf - -inf) never makes a NaN. */
static void softmax_chunk(float *S, int nc, int RP, float *m, float *l, float *alpha) {
    int r = 0;
#if defined(RP_AVX512VNNI)
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (; r < RP; r += 16) {
        __m512 m_old = _mm512_loadu_ps(m + r), mc = ninf;
        for (int c = 0; c < nc; c++) mc = _mm512_max_ps(mc, _mm512_loadu_ps(S + c * RP + r));
        __m512 m_new = _mm512_max_ps(m_old, mc);
        __m512 sub = _mm512_mask_mov_ps(m_new, _mm512_cmp_ps_mask(m_new, ninf, _CMP_EQ_OQ), _mm512_setzero_ps());
        __m512 a = rp_exp16(_mm512_sub_ps(m_old, sub)), sum = _mm512_setzero_ps();
        for (int c = 0; c < nc; c++) {
            __m512 p = rp_exp16(_mm512_sub_ps(_mm512_loadu_ps(S + c * RP + r), sub));
            _mm512_storeu_ps(S + c * RP + r, p);
            sum = _mm512_add_ps(sum, p);
        }
        _mm512_storeu_ps(l + r, _mm512_fmadd_ps(_mm512_loadu_ps(l + r), a, sum));
        _mm512_storeu_ps(m + r, m_new);
        _mm512_storeu_ps(alpha + r, a);
    }
#elif defined(RP_AVX2)
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (; r < RP; r += 8) {
        __m256 m_old = _mm256_loadu_ps(m + r), mc = ninf;
        for (int c = 0; c < nc; c++) mc = _mm256_max_ps(mc, _mm256_loadu_ps(S + c * RP + r));
        __m256 m_new = _mm256_max_ps(m_old, mc);
        __m256 sub = _mm256_andnot_ps(_mm256_cmp_ps(m_new, ninf, _CMP_EQ_OQ), m_new);
        __m256 a = rp_exp8(_mm256_sub_ps(m_old, sub)), sum = _mm256_setzero_ps();
        for (int c = 0; c < nc; c++) {
            __m256 p = rp_exp8(_mm256_sub_ps(_mm256_loadu_ps(S + c * RP + r), sub));
            _mm256_storeu_ps(S + c * RP + r, p);
            sum = _mm256_add_ps(sum, p);
        }
        _mm256_storeu_ps(l + r, _mm256_fmadd_ps(_mm256_loadu_ps(l + r), a, sum));
        _mm256_storeu_ps(m + r, m_new);
        _mm256_storeu_ps(alpha + r, a);
    }
#endif
    for (; r < RP; r++) {
        float mc = -INFINITY, sum = 0.0f;
        for (int c = 0; c < nc; c++) mc = fmaxf(mc, S[c * RP + r]);
        float m_new = fmaxf(m[r], mc), sub = m_new == -INFINITY ? 0.0f : m_new;
        float a = expf(m[r] - sub);
        for (int c = 0; c < nc; c++) sum += (S[c * RP + r] = expf(S[c * RP + r] - sub));
        l[r] = l[r] * a + sum;
        m[r] = m_new;
        alpha[r] = a;
    }
}

/* The chunk's K or V rows as float32: pointers into the cache, or (float16) into
 * buf [nc, D], converted once for every row of the tile. */
static void chunk_rows(const float **rows, const char *const *src, int nc, int kv_dtype, float *buf, int D) {
    for (int c = 0; c < nc; c++) {
        if (kv_dtype == RP_KV_F32) {
            rows[c] = (const float *)src[c];
        } else {
            rp_f16_row_to_f32(buf + c * D, (const uint16_t *)src[c], D);
            rows[c] = buf + c * D;
        }
    }
}

#if defined(RP_AVX512VNNI)
/* The sums of 16 vectors, in order, in one vector: a transpose and add in four
 * steps (pairs within 128-bit lanes, then 64-bit pairs, then 128-bit lanes twice),
 * 45 instructions for 16 sums instead of 16 reductions of ~8 each. */
static inline __m512 hsum16x16(const __m512 *v) {
    __m512 x[8], y[4], z[2];
    for (int i = 0; i < 8; i++) x[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        __m512d a = _mm512_castps_pd(x[2 * i]), b = _mm512_castps_pd(x[2 * i + 1]);
        y[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    for (int i = 0; i < 2; i++) z[i] = _mm512_add_ps(_mm512_shuffle_f32x4(y[2 * i], y[2 * i + 1], 0x88), _mm512_shuffle_f32x4(y[2 * i], y[2 * i + 1], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], 0x88), _mm512_shuffle_f32x4(z[0], z[1], 0xdd));
}
#endif

/* S[c, r] = qs[r] . k[c] for the chunk's nc keys and the tile's rows (S is [nc, RP]).
 * AVX-512: 4 keys x 4 rows at a time, 16 accumulators over D (8 loads feed 16 FMAs),
 * summed across lanes together. Rows up to R rounded to 4 must exist in qs (zeros). */
static void chunk_scores(float *S, int RP, const float *qs, int R, int D, const float *const *k, int nc) {
#if defined(RP_AVX512VNNI)
    for (int c0 = 0; c0 < nc; c0 += 4) {
        const float *kr[4];
        for (int ci = 0; ci < 4; ci++) kr[ci] = k[c0 + ci < nc ? c0 + ci : c0]; /* past the chunk: scored, not used */
        for (int r0 = 0; r0 < R; r0 += 4) {
            __m512 acc[16];
            for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
            for (int d = 0; d < D; d += 16) {
                __mmask16 mk = rp_tail16(D - d);
                __m512 kv[4], qv[4];
                for (int i = 0; i < 4; i++) kv[i] = _mm512_maskz_loadu_ps(mk, kr[i] + d);
                for (int i = 0; i < 4; i++) qv[i] = _mm512_maskz_loadu_ps(mk, qs + (r0 + i) * D + d);
                for (int ci = 0; ci < 4; ci++)
                    for (int ri = 0; ri < 4; ri++) acc[ci * 4 + ri] = _mm512_fmadd_ps(kv[ci], qv[ri], acc[ci * 4 + ri]);
            }
            __m512 sums = hsum16x16(acc); /* lanes: key c0 rows r0..r0+3, key c0 + 1 rows ..., ... */
            _mm_storeu_ps(S + (c0 + 0) * RP + r0, _mm512_extractf32x4_ps(sums, 0));
            _mm_storeu_ps(S + (c0 + 1) * RP + r0, _mm512_extractf32x4_ps(sums, 1));
            _mm_storeu_ps(S + (c0 + 2) * RP + r0, _mm512_extractf32x4_ps(sums, 2));
            _mm_storeu_ps(S + (c0 + 3) * RP + r0, _mm512_extractf32x4_ps(sums, 3));
        }
    }
#else
    for (int c = 0; c < nc; c++)
        for (int r = 0; r < R; r++) S[c * RP + r] = rp_dot(qs + r * D, k[c], D);
#endif
}

/* acc[r] += sum_c P[c, r] v[c] (P is S after the softmax, [nc, RP]).
 * AVX-512: 4 rows x 64 columns of acc stay in 16 registers over the whole chunk; each
 * V row's 4 vectors feed 16 FMAs. Rows up to R rounded to 4 must exist in acc. */
static void chunk_accumulate(float *acc, int R, int D, const float *P, int RP, const float *const *v, int nc) {
#if defined(RP_AVX512VNNI)
    for (int r0 = 0; r0 < R; r0 += 4)
        for (int d0 = 0; d0 < D; d0 += 64) {
            __mmask16 mk[4];
            __m512 o[16];
            for (int vi = 0; vi < 4; vi++) mk[vi] = d0 + 16 * vi < D ? rp_tail16(D - d0 - 16 * vi) : 0;
            for (int ri = 0; ri < 4; ri++)
                for (int vi = 0; vi < 4; vi++) o[ri * 4 + vi] = _mm512_maskz_loadu_ps(mk[vi], acc + (r0 + ri) * D + d0 + 16 * vi);
            for (int c = 0; c < nc; c++) {
                __m512 vv[4];
                for (int vi = 0; vi < 4; vi++) vv[vi] = _mm512_maskz_loadu_ps(mk[vi], v[c] + d0 + 16 * vi);
                for (int ri = 0; ri < 4; ri++) {
                    __m512 p = _mm512_set1_ps(P[c * RP + r0 + ri]);
                    for (int vi = 0; vi < 4; vi++) o[ri * 4 + vi] = _mm512_fmadd_ps(p, vv[vi], o[ri * 4 + vi]);
                }
            }
            for (int ri = 0; ri < 4; ri++)
                for (int vi = 0; vi < 4; vi++) _mm512_mask_storeu_ps(acc + (r0 + ri) * D + d0 + 16 * vi, mk[vi], o[ri * 4 + vi]);
        }
#else
    for (int c = 0; c < nc; c++)
        for (int r = 0; r < R; r++) {
            float p = P[c * RP + r];
            if (p != 0.0f) rp_axpy(acc + r * D, p, v[c], D);
        }
#endif
}

/* Where keys j0 .. min(j0 + Bc, j1) of one KV head sit: walk the block table once
 * (key j is at block table[j / BS], offset j % BS). Returns how many. */
static int chunk_sources(const char **k_src, const char **v_src, const int32_t *table, int j0, int j1, int BS,
                         const char *k_base, const char *v_base, size_t row_bytes) {
    const int nc = j1 - j0 < RP_ATTN_BC ? j1 - j0 : RP_ATTN_BC;
    for (int c = 0, blk = j0 / BS, off = j0 % BS; c < nc; c++) {
        size_t slot = (size_t)table[blk] * BS + off;
        k_src[c] = k_base + slot * row_bytes;
        v_src[c] = v_base + slot * row_bytes;
        if (++off == BS) off = 0, blk++;
    }
    return nc;
}

/* Ask for keys j0 .. min(j0 + Bc, j1)'s K and V rows of one head (head_bytes each)
 * ahead of their use, into L2 (k_src, v_src: scratch). One head's row of consecutive
 * keys lies Hkv D apart (the pool's [NB, BS, Hkv, D]), 2 KiB at Llama-3.2-1B's 8 x 64
 * floats: the hardware prefetcher, which follows strides within a 4 KiB page, sees
 * two keys a page and barely helps. (Into L1 instead, a chunk's 32 KiB would evict
 * the chunk in use.) */
static void prefetch_chunk(const char **k_src, const char **v_src, const int32_t *table, int j0, int j1, int BS,
                           const char *k_base, const char *v_base, size_t row_bytes, size_t head_bytes) {
    const int nc = chunk_sources(k_src, v_src, table, j0, j1, BS, k_base, v_base, row_bytes);
    for (int c = 0; c < nc; c++)
        for (size_t b = 0; b < head_bytes; b += 64) {
            __builtin_prefetch(k_src[c] + b, 0, 2);
            __builtin_prefetch(v_src[c] + b, 0, 2);
        }
}

static void attend_item(const attn_args *a, const attn_item *it) {
    const int D = a->D, G = a->H / a->Hkv, BS = a->BS, W = a->window, ng = it->ng;
    const int R = it->nq * ng, RP = (R + RP_VW - 1) / RP_VW * RP_VW; /* rows, padded to whole vectors */
    const int R4 = (R + 3) / 4 * 4;                                   /* rows the AVX-512 kernels touch */
    const int first = a->query_start_loc[it->seq], n = a->query_start_loc[it->seq + 1] - first;
    const int P0 = a->seq_lens[it->seq] - n + it->q0, P1 = P0 + it->nq - 1; /* the tile's first and last query */
    const size_t esz = a->kv_dtype == RP_KV_F16 ? 2 : 4, row_bytes = (size_t)a->Hkv * D * esz;
    const int32_t *table = a->block_tables + (int64_t)it->seq * a->max_blocks;
    const char *k_base = (const char *)a->k_cache + (size_t)it->kh * D * esz;
    const char *v_base = (const char *)a->v_cache + (size_t)it->kh * D * esz;

    _Alignas(64) float qs[RP_ATTN_ROWS * RP_ATTN_MAX_D];  /* [R, D] q scale: row r = query r / ng, head g0 + r % ng */
    _Alignas(64) float acc[RP_ATTN_ROWS * RP_ATTN_MAX_D]; /* [R, D] sum_j exp(s_j - m) v_j */
    _Alignas(64) float S[RP_ATTN_BC * RP_ATTN_ROWS];      /* [Bc, RP] scores, then P: rows contiguous */
    _Alignas(64) float buf[RP_ATTN_BC * RP_ATTN_MAX_D];   /* [Bc, D] a float16 chunk's K, then V, as float32 */
    _Alignas(64) float m[RP_ATTN_ROWS], l[RP_ATTN_ROWS], alpha[RP_ATTN_ROWS];
    int pos[RP_ATTN_ROWS];
    const char *k_src[RP_ATTN_BC], *v_src[RP_ATTN_BC];
    const float *rows[RP_ATTN_BC];

    for (int r = 0; r < RP; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
        pos[r] = P0 + (r < R ? r / ng : it->nq - 1); /* padding rows mask like the last row */
    }
    for (int r = 0; r < R; r++) {
        const float *src = a->q + (int64_t)(first + it->q0 + r / ng) * a->q_stride + (int64_t)(it->kh * G + it->g0 + r % ng) * D;
        for (int d = 0; d < D; d++) qs[r * D + d] = src[d] * a->scale;
    }
    memset(qs + R * D, 0, sizeof(float) * (R4 - R) * D);
    memset(acc, 0, sizeof(float) * R4 * D);
    memset(S, 0, sizeof(float) * RP_ATTN_BC * RP); /* padding rows score 0 and are never read back */

    const size_t head_bytes = (size_t)D * esz;
    for (int a0 = it->k0; a0 < it->k1 && a0 < it->k0 + RP_ATTN_AHEAD * RP_ATTN_BC; a0 += RP_ATTN_BC)
        prefetch_chunk(k_src, v_src, table, a0, it->k1, BS, k_base, v_base, row_bytes, head_bytes);
    for (int j0 = it->k0; j0 < it->k1; j0 += RP_ATTN_BC) {
        /* Ask for the chunk RP_ATTN_AHEAD ahead, so that it arrives while these are computed. */
        if (j0 + RP_ATTN_AHEAD * RP_ATTN_BC < it->k1)
            prefetch_chunk(k_src, v_src, table, j0 + RP_ATTN_AHEAD * RP_ATTN_BC, it->k1, BS, k_base, v_base, row_bytes, head_bytes);
        const int nc = chunk_sources(k_src, v_src, table, j0, it->k1, BS, k_base, v_base, row_bytes);

        /* S = (Q scale) K^T: each K row read once, for every row of the tile */
        chunk_rows(rows, k_src, nc, a->kv_dtype, buf, D);
        chunk_scores(S, RP, qs, R, D, rows, nc);
        if (a->soft_cap > 0.0f) soft_cap_scores(S, nc * RP, a->soft_cap);
        /* Causal and window mask, only on chunks some row does not wholly see. */
        if (j0 + nc - 1 > P0 || (W > 0 && j0 <= P1 - W)) {
            for (int c = 0; c < nc; c++)
                for (int r = 0; r < RP; r++)
                    if (j0 + c > pos[r] || (W > 0 && j0 + c <= pos[r] - W)) S[c * RP + r] = -INFINITY;
        }

        /* m, l, alpha; P = exp(S - m) */
        softmax_chunk(S, nc, RP, m, l, alpha);
        for (int r = 0; r < R; r++)
            if (alpha[r] != 1.0f)
                for (int d = 0; d < D; d++) acc[r * D + d] *= alpha[r];

        /* acc += P V: each V row read once, for every row of the tile */
        chunk_rows(rows, v_src, nc, a->kv_dtype, buf, D);
        chunk_accumulate(acc, R, D, S, RP, rows, nc);
    }

    if (it->slot < 0) { /* o = acc / l; every row sees at least its own key, so l >= 1 */
        for (int r = 0; r < R; r++) {
            float *o = a->out + ((int64_t)(first + it->q0 + r / ng) * a->H + it->kh * G + it->g0 + r % ng) * D;
            float inv = 1.0f / l[r];
            for (int d = 0; d < D; d++) o[d] = acc[r * D + d] * inv;
        }
    } else {
        memcpy(a->part_acc + (size_t)it->slot * RP_ATTN_ROWS * D, acc, sizeof(float) * R * D);
        for (int r = 0; r < R; r++) {
            a->part_ml[((size_t)it->slot * RP_ATTN_ROWS + r) * 2] = m[r];
            a->part_ml[((size_t)it->slot * RP_ATTN_ROWS + r) * 2 + 1] = l[r];
        }
    }
}

/* The first cut after key position j (see the header): the fixed cut positions are
 * 128, 256, 384, then the multiples of 512. */
static int next_cut(int j) {
    const int step = j < RP_ATTN_PART ? RP_ATTN_PART_NEAR : RP_ATTN_PART;
    return (j / step + 1) * step;
}

/* The parts a tile's keys [k0, k1) are cut into. */
static int tile_parts(const attn_item *t) {
    int parts = 1;
    for (int j = next_cut(t->k0); j < t->k1; j = next_cut(j)) parts++;
    return parts;
}

/* Merge the parts of one cut tile, `it` one of its parts (in slot order p = 0 .. parts - 1):
 *     M = max_p m_p,  o = sum_p exp(m_p - M) acc_p / sum_p exp(m_p - M) l_p */
static void merge_parts(const attn_args *a, const attn_item *it) {
    const int D = a->D, G = a->H / a->Hkv, R = it->nq * it->ng, first = a->query_start_loc[it->seq];
    for (int r = 0; r < R; r++) {
        float M = -INFINITY, L = 0.0f;
        for (int p = 0; p < it->tile_parts; p++) M = fmaxf(M, a->part_ml[((size_t)(it->first_slot + p) * RP_ATTN_ROWS + r) * 2]);
        float *o = a->out + ((int64_t)(first + it->q0 + r / it->ng) * a->H + it->kh * G + it->g0 + r % it->ng) * D;
        memset(o, 0, sizeof(float) * D);
        for (int p = 0; p < it->tile_parts; p++) {
            const float *ml = a->part_ml + ((size_t)(it->first_slot + p) * RP_ATTN_ROWS + r) * 2;
            if (ml[0] == -INFINITY) continue; /* a part no key of which this row sees */
            float w = expf(ml[0] - M);
            L += w * ml[1];
            rp_axpy(o, w, a->part_acc + ((size_t)(it->first_slot + p) * RP_ATTN_ROWS + r) * D, D);
        }
        float inv = 1.0f / L;
        for (int d = 0; d < D; d++) o[d] *= inv;
    }
}

static void attend_task(void *arg, int ith, int nth) {
    (void)ith, (void)nth;
    attn_args *a = arg;
    for (;;) {
        int i = atomic_fetch_add_explicit(&a->next, 1, memory_order_relaxed);
        if (i >= a->n_items) return;
        const attn_item *it = &a->items[i];
        attend_item(a, it);
        /* The thread that finishes a cut tile's last part merges its parts (acq_rel:
         * it sees the partials the other parts' threads wrote). The merge reads them in
         * slot order, so whichever thread merges, the bits are the same. */
        if (it->slot >= 0 && atomic_fetch_sub_explicit(&a->parts_left[it->tile], 1, memory_order_acq_rel) == 1)
            merge_parts(a, it);
    }
}

static int by_cost_desc(const void *x, const void *y) {
    int64_t a = ((const attn_item *)x)->cost, b = ((const attn_item *)y)->cost;
    return (a < b) - (a > b);
}

/* The tiles of the batch (items == NULL: just count them). */
static int make_tiles(const attn_args *a, int B, attn_item *items) {
    const int G = a->H / a->Hkv, g_chunk = G < RP_ATTN_ROWS ? G : RP_ATTN_ROWS;
    int count = 0;
    for (int i = 0; i < B; i++) {
        const int n = a->query_start_loc[i + 1] - a->query_start_loc[i], L = a->seq_lens[i];
        for (int kh = 0; kh < a->Hkv && n > 0; kh++)
            for (int g0 = 0; g0 < G; g0 += g_chunk) {
                const int ng = G - g0 < g_chunk ? G - g0 : g_chunk, q_tile = RP_ATTN_ROWS / ng;
                for (int q0 = 0; q0 < n; q0 += q_tile, count++) {
                    if (!items) continue;
                    attn_item *it = &items[count];
                    const int nq = n - q0 < q_tile ? n - q0 : q_tile, p0 = L - n + q0;
                    it->seq = i, it->kh = kh, it->g0 = g0, it->ng = ng, it->q0 = q0, it->nq = nq;
                    it->k0 = a->window > 0 && p0 - a->window + 1 > 0 ? p0 - a->window + 1 : 0;
                    it->k1 = p0 + nq;
                    it->slot = -1, it->first_slot = -1, it->tile = count, it->tile_parts = 1;
                    it->cost = (int64_t)nq * ng * (it->k1 - it->k0) + 64 * nq * ng; /* + per-row setup */
                }
            }
    }
    return count;
}

RP_EXPORT void rp_paged_attention(float *out, const float *q, int64_t q_stride, const void *k_cache, const void *v_cache,
                                  int kv_dtype, const int32_t *block_tables, int max_blocks, const int32_t *seq_lens,
                                  const int32_t *query_start_loc, int B, int H, int Hkv, int D, int BS, float scale,
                                  int sliding_window, float soft_cap, int nthreads) {
    attn_args a = {out, q, q_stride, k_cache, v_cache, kv_dtype, block_tables, seq_lens, query_start_loc, max_blocks,
                   H, Hkv, D, BS, sliding_window, scale, soft_cap, NULL, 0, NULL, NULL, NULL, 0};
    const int n_tiles = make_tiles(&a, B, NULL);
    if (n_tiles == 0) return;
    attn_item *tiles = malloc(sizeof(attn_item) * n_tiles);
    make_tiles(&a, B, tiles);

    /* Cut each tile's keys at the fixed cut positions (see the header). */
    int n_items = 0, n_slots = 0;
    for (int t = 0; t < n_tiles; t++) n_items += tile_parts(&tiles[t]);
    attn_item *items = tiles;
    if (n_items > n_tiles) {
        items = malloc(sizeof(attn_item) * n_items);
        a.parts_left = malloc(sizeof(atomic_int) * (size_t)n_tiles);
        n_items = 0;
        for (int t = 0; t < n_tiles; t++) {
            const attn_item *tile = &tiles[t];
            const int parts = tile_parts(tile);
            atomic_init(&a.parts_left[t], parts);
            for (int p = 0, j = tile->k0; p < parts; p++, j = next_cut(j)) {
                attn_item *it = &items[n_items++];
                *it = *tile;
                it->k0 = j;
                it->k1 = p == parts - 1 ? tile->k1 : next_cut(j);
                it->slot = parts > 1 ? n_slots++ : -1;
                it->first_slot = it->slot - p;
                it->tile = t;
                it->tile_parts = parts;
                it->cost = (int64_t)tile->nq * tile->ng * (it->k1 - it->k0) + 64 * tile->nq * tile->ng;
            }
        }
        free(tiles);
        a.part_acc = malloc(sizeof(float) * ((size_t)n_slots * RP_ATTN_ROWS * D + 1));
        a.part_ml = malloc(sizeof(float) * ((size_t)n_slots * RP_ATTN_ROWS * 2 + 1));
    }

    /* Costliest first (the parts of a cut tile are merged by whichever thread ends its last) */
    qsort(items, n_items, sizeof(attn_item), by_cost_desc);
    a.items = items;
    a.n_items = n_items;
    atomic_init(&a.next, 0);
    rp_parallel(attend_task, &a, nthreads < n_items ? nthreads : n_items);

    free(items); /* (the tiles themselves when nothing was cut) */
    free(a.part_acc);
    free(a.part_ml);
    free(a.parts_left);
}
