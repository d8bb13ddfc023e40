// Paged attention for prefill: variable-length chunks of query tokens, causal,
// against the paged K/V of each sequence's context (the cached prefix plus the
// chunk itself, which write_kv has already stored). float16 and bfloat16 on
// tensor cores; float32 is paged_attention_prefill_f32.cu.
//
// Sequence b owns query rows q[query_start_loc[b] : query_start_loc[b+1]]: the
// last n tokens of its L = seq_lens[b] tokens of context, so query row i sits at
// position L - n + i and sees keys 0 .. L - n + i.
//
// Image rows (key_end, null = off): row r also sees the keys up to key_end[r]
//   (Gemma 3: the tokens of an image attend to each other both ways, so an image
//   token sees its whole image, later tokens included; key_end = -1 for other
//   rows). The block's key range ends at the largest key any of its rows sees,
//   clamped to the context (the scheduler computes an image in one step, so its
//   last key is in the cache); a row's mask is key > max(p, key_end[r]).
// Options (0 = off), as in paged_attention_decode.cu:
//   sliding window W: row at position p sees keys p-W+1 .. p; key tiles wholly
//     before the tile's first row's window are never visited, and keys before it
//     are never read (their blocks may be freed), so the j loop starts at
//     Tlo = floor(max(0, pos0 - W + 1) / Bc);
//   soft cap c: S_ij = c tanh(S_ij / c) before the mask;
//   FP8 cache (C = fp8_e4m3): K_j, V_j are converted to T on their way into
//     shared memory (plain loads, not cp.async); k_scale folds into the score
//     scale and v_scale into the final 1 / l.
// A row whose window starts past a visited tile sees only -inf there: it keeps
// m = -inf and adds nothing (the exponent's reference is 0 while m is -inf).
//
// FlashAttention-2 (Dao, 2023, Algorithm 1) in the paper's notation. The chunk's
// rows are cut into Tr tiles Q_i of Br rows, the visible keys into Tc tiles
// K_j, V_j of Bc keys; one block owns one Q_i and walks j = 0 .. Tc-1, with the
// running row max m and row sum l of each row in registers:
//   S_ij = Q_i K_j^T * scale * log2(e)            (key > query position -> -inf)
//   m_new = max(m, rowmax(S_ij))
//   P_ij = 2^(S_ij - m_new)
//   l = l 2^(m - m_new) + rowsum(P_ij)
//   O_i = O_i 2^(m - m_new) + P_ij V_j             (O_i unnormalized, in registers)
//   m = m_new
// and once at the end O_i / l. Causal: tile j is visited only if some row of the
// tile sees its first key, so Tc = ceil((last row's position + 1) / Bc) and the
// tiles past the diagonal are never loaded; a warp whose 16 rows all precede a
// tile skips its math; only the tiles that straddle a row's position are masked.
//
// Work split (FA2): each of the 4 warps owns 16 rows of Q_i, end to end: it
// computes its 16 x Bc slice of S_ij and its 16 x D slice of O_i, and no
// softmax state ever crosses warps, so warps only meet at the K/V tile barriers.
// Both products are mma.sync m16n8k16 (cuda/mma.cuh, float accumulation):
//   S (16 x Bc) = Q (16 x D) K^T:  A = Q rows (ldmatrix), B = K rows as columns (ldmatrix)
//   O (16 x D) += P (16 x Bc) V:    A = P, straight from the S accumulators: the
//                                   m16n8k16 accumulator layout of two adjacent
//                                   8-key tiles IS the A layout of one 16-key step,
//                                   B = V (ldmatrix .trans: V rows are k, not n)
// In an accumulator, lane l holds rows g = l/4 and g+8, columns 2(l%4) and
// 2(l%4)+1 of each 8-wide tile, so a row's values live in the 4 lanes of a quad:
// rowmax is 2 shuffles, and rowsum is left per-lane until the end.
//
// Memory: K_j, V_j are gathered from the cache through the block table with
// 16-byte cp.async into one of two shared-memory stages, while the warps work on
// the other (tile j+1 loads during tile j's math). Keys past the visible range
// are zero-filled without reading (a masked P = 0 must not meet NaN garbage).
//
// Grid: (Tr = ceil(max_query_len / Br), H, B): one block per query tile, head
// and sequence; tiles past a sequence's chunk exit at once. The x index runs
// backwards, so the causally heaviest tiles (last rows, most keys) start first.
// Block: 4 warps = 128 threads; warp w owns rows 16w .. 16w+15 of Q_i.
#include "common.cuh"
#include "fp8.cuh"

using namespace rawpage;

namespace prefill {
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kBr = 16 * kWarps;  // query rows per block
constexpr float kLog2e = 1.4426950408889634f;
}  // namespace prefill

// Dynamic shared memory, in T (the launch code's prefill_smem_bytes computes the
// same kBytes). Rows are padded by 8 elements (16 bytes), so that the 8 rows of
// one ldmatrix 8x8 matrix start 16 bytes apart in the bank space (conflict-free)
// and every row start stays 16-byte aligned for cp.async and ldmatrix.
template <typename T, int D, int Bc>
struct PrefillSmem {
  static constexpr int kLd = D + 8;
  __host__ __device__ static constexpr int align(int bytes) { return (bytes + 127) / 128 * 128; }
  static constexpr int kTile = align(Bc * kLd * int(sizeof(T)));  // one K or V stage
  static constexpr int kQ = 0;                                     // [Br][kLd]
  static constexpr int kK = kQ + align(prefill::kBr * kLd * int(sizeof(T)));  // [2][Bc][kLd]
  static constexpr int kV = kK + 2 * kTile;                                    // [2][Bc][kLd]
  static constexpr int kBytes = kV + 2 * kTile;
};

// Q is kept in registers as A fragments when it fits (D <= 128: D/2 registers a
// lane); at D = 256 it stays in shared memory and is re-read by ldmatrix.
template <int D>
struct QInRegs {
  static constexpr bool value = D <= 128;
};

// 8 e4m3 codes (8 bytes at src) as 8 T (16 bytes at dst, shared memory); zeros
// without reading when !valid.
template <typename T>
__device__ __forceinline__ void load_e4m3_x8(T* dst, const fp8_e4m3* src, bool valid) {
  uint2 raw = {0u, 0u};
  if (valid) raw = *reinterpret_cast<const uint2*>(src);
  const unsigned char* codes = reinterpret_cast<const unsigned char*>(&raw);
  uint4 row;
  T* e = reinterpret_cast<T*>(&row);
#pragma unroll
  for (int i = 0; i < 8; ++i) e[i] = from_float<T>(e4m3_to_float(codes[i]));
  *reinterpret_cast<uint4*>(dst) = row;
}

template <typename T, typename C, int D, int Bc>
__device__ void paged_attention_prefill(
    T* __restrict__ out,                      // [T, H, D]
    const T* __restrict__ q,                  // [T, H, D], token stride q_stride
    const C* __restrict__ k_cache,            // [NB, BS, Hkv, D], C = T or fp8_e4m3
    const C* __restrict__ v_cache,            // [NB, BS, Hkv, D]
    const int* __restrict__ block_tables,     // [B, max_blocks]
    const int* __restrict__ seq_lens,         // [B], context length including the chunk
    const int* __restrict__ query_start_loc,  // [B+1]
    int max_blocks, int num_kv_heads, int block_size, int q_stride, float scale,
    int smem_bytes,  // the launch's dynamic shared memory, checked against the layout
    int sliding_window, float soft_cap,
    const int* __restrict__ key_end,        // [T] last key each row sees beyond its own, -1: none; null: causal
    const float* __restrict__ kv_scales) {  // [2] (k_scale, v_scale) for an FP8 cache, else null
  using namespace prefill;
  using L = PrefillSmem<T, D, Bc>;
  static_assert(D % 16 == 0 && Bc % 16 == 0, "m16n8k16 tiles: D and Bc multiples of 16");
  constexpr int kChunks = D * int(sizeof(T)) / 16;  // 16-byte chunks per head vector
  constexpr int kDk = D / 16;                       // k-steps of S = Q K^T
  constexpr int kNs = Bc / 8;                       // 8-key accumulator tiles of S
  constexpr int kNo = D / 8;                        // 8-column accumulator tiles of O
  if (smem_bytes < L::kBytes) __trap();             // a launch-code bug, not a data error

  const int tile = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int num_heads = gridDim.y;
  const int q_begin = query_start_loc[b], n = query_start_loc[b + 1] - q_begin;
  const int r0 = tile * kBr;
  if (r0 >= n) return;  // this sequence's chunk has fewer tiles than the longest one
  const int rows = min(kBr, n - r0);      // real query rows in the tile
  const int pos0 = seq_lens[b] - n + r0;  // position of the tile's first row
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;  // accumulator rows g, g+8; columns 2t, 2t+1
  // keys [0, kv_end) are visible to some row: causally up to the last row, and up to
  // the furthest image key of any row
  int kv_end = pos0 + rows;
  if (key_end != nullptr) kv_end = min(max(kv_end, block_max_of(key_end + q_begin + r0, rows) + 1), seq_lens[b]);
  const int num_kv_tiles = ceil_div(kv_end, Bc);  // Tc: tiles past the diagonal are never visited
  const int kv_begin = sliding_window > 0 ? max(0, pos0 - sliding_window + 1) : 0;  // first key any row sees
  const int first_kv_tile = kv_begin / Bc;                                          // Tlo
  const int kv_head = h / (num_heads / num_kv_heads);

  unsigned char* smem = dynamic_smem<unsigned char>();
  T* Qs = reinterpret_cast<T*>(smem + L::kQ);

  // Gather K_j, V_j (keys j*Bc .. j*Bc+Bc-1) into stage s: each thread issues
  // 16-byte copies of whole chunks; keys outside [kv_begin, kv_end) are
  // zero-filled, and their block table entries are never read.
  // Consecutive threads take consecutive chunks of a row, so a warp's copies
  // cover whole rows (coalesced); the trip counts are exact (D/16 per tile).
  static_assert(Bc * kChunks % kThreads == 0 && kBr * kChunks % kThreads == 0, "whole passes");
  const int* table = block_tables + i64(b) * max_blocks;
  const i64 token_stride = i64(num_kv_heads) * D;  // elements from one cache slot to the next
  const C* k_head = k_cache + kv_head * D;
  const C* v_head = v_cache + kv_head * D;
  auto load_kv_tile = [&](int j, int s) {
    T* Ks = reinterpret_cast<T*>(smem + L::kK + s * L::kTile);
    T* Vs = reinterpret_cast<T*>(smem + L::kV + s * L::kTile);
#pragma unroll 2
    for (int pass = 0; pass < Bc * kChunks / kThreads; ++pass) {
      const int c = threadIdx.x + pass * kThreads;
      const int r = c / kChunks, part = c % kChunks, key = j * Bc + r;
      const bool valid = key >= kv_begin && key < kv_end;
      i64 offset = 0;
      if (valid) offset = (i64(table[key / block_size]) * block_size + key % block_size) * token_stride;
      if constexpr (is_same<C, T>::value) {
        cp_async_16(Ks + r * L::kLd + part * 8, k_head + offset + part * 8, valid);
        cp_async_16(Vs + r * L::kLd + part * 8, v_head + offset + part * 8, valid);
      } else {  // FP8: 8 codes -> 8 T, stored before the barrier that publishes the tile
        load_e4m3_x8<T>(Ks + r * L::kLd + part * 8, k_head + offset + part * 8, valid);
        load_e4m3_x8<T>(Vs + r * L::kLd + part * 8, v_head + offset + part * 8, valid);
      }
    }
  };

  // Q_i (rows past the chunk are zero) and K_0, V_0 as the first cp.async group.
#pragma unroll
  for (int pass = 0; pass < kBr * kChunks / kThreads; ++pass) {
    const int c = threadIdx.x + pass * kThreads;
    const int r = c / kChunks, part = c % kChunks;
    const bool valid = r < rows;
    const T* src = q + (valid ? i64(q_begin + r0 + r) * q_stride + h * D + part * 8 : 0);
    cp_async_16(Qs + r * L::kLd + part * 8, src, valid);
  }
  load_kv_tile(first_kv_tile, first_kv_tile % 2);
  cp_async_commit();

  // The warp's rows: 16w + g and 16w + g + 8 of the tile, at positions row_pos[0..1],
  // seeing keys up to row_last[0..1] (beyond their own position in an image); the
  // warp's rows see keys up to warp_last_key.
  const int warp_row0 = warp * 16;
  const bool warp_has_rows = warp_row0 < rows;
  const int warp_first_pos = pos0 + warp_row0;
  int warp_last_key = pos0 + min(warp_row0 + 15, rows - 1);
  const int row_pos[2] = {warp_first_pos + g, warp_first_pos + g + 8};
  int row_last[2] = {row_pos[0], row_pos[1]};
  if (key_end != nullptr) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp_row0 + g + 8 * r;
      if (row >= rows) continue;  // a padding row: never written, sees nothing more
      row_last[r] = max(row_pos[r], key_end[q_begin + r0 + row]);
      warp_last_key = max(warp_last_key, row_last[r]);
    }
    warp_last_key = warp_max(warp_last_key);
  }
  const int warp_last_pos = pos0 + min(warp_row0 + 15, rows - 1);
  const float k_scale = kv_scales ? kv_scales[0] : 1.0f, v_scale = kv_scales ? kv_scales[1] : 1.0f;
  const float scale_log2 = scale * kLog2e * k_scale;
  const float cap_log2 = soft_cap * kLog2e;  // the soft cap in log2 units
  // The warp's rows see keys from warp_first_pos - W + 1 on (its first row's window).
  const int warp_first_key = sliding_window > 0 ? warp_first_pos - sliding_window + 1 : 0;

  float o[kNo][4];  // O_i accumulators: columns 8n + 2t, +1 of rows g (0, 1) and g+8 (2, 3)
#pragma unroll
  for (int nt = 0; nt < kNo; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
  float m[2] = {neg_inf(), neg_inf()};  // running row max (log2 units), rows g and g+8
  float l[2] = {0.0f, 0.0f};            // this lane's part of the running row sum
  unsigned qf[QInRegs<D>::value ? kDk : 1][4];  // Q_i A fragments, when kept in registers

  // The ldmatrix row address each lane supplies (see cuda/mma.cuh): for an A
  // tile, matrix lane/8 is (rows +0/+8, k +0/+8) = (lane%16, 8*(lane/16)); for
  // K as B, (key, k) = (8*(lane/16) + lane%8, 8*((lane/8)%2)); for V as B
  // (transposed), (key, column) = (lane%16, 8*(lane/16)).
  const T* q_frag_row = Qs + (warp_row0 + lane % 16) * L::kLd + 8 * (lane / 16);
  const int k_frag_off = (8 * (lane / 16) + lane % 8) * L::kLd + 8 * ((lane / 8) % 2);
  const int v_frag_off = (lane % 16) * L::kLd + 8 * (lane / 16);

  for (int j = first_kv_tile; j < num_kv_tiles; ++j) {
    const int stage = j % 2, kv0 = j * Bc;
    // Prefetch K_{j+1}, V_{j+1} into the other stage (free: the barrier at the
    // end of iteration j-1 saw every warp finish with it), then wait for K_j, V_j.
    if (j + 1 < num_kv_tiles) load_kv_tile(j + 1, stage ^ 1);
    cp_async_commit();  // possibly empty, so that "all but the newest group" is always tile j
    cp_async_wait<1>();
    __syncthreads();  // every thread's K_j, V_j (cp.async, or FP8 converted) and, at the first tile, Q_i are in

    if (QInRegs<D>::value && j == first_kv_tile) {
#pragma unroll
      for (int kk = 0; kk < kDk; ++kk) ldmatrix_x4(qf[kk], q_frag_row + 16 * kk);
    }

    // Warp-uniform: a tile past every key the 16 rows see, or before all their windows, is skipped.
    if (warp_has_rows && kv0 <= warp_last_key && kv0 + Bc - 1 >= warp_first_key) {
      const T* Ks = reinterpret_cast<const T*>(smem + L::kK + stage * L::kTile);
      const T* Vs = reinterpret_cast<const T*>(smem + L::kV + stage * L::kTile);

      // S_ij = Q_i K_j^T for the warp's 16 rows: per k-step of 16, one ldmatrix_x4
      // gives the B fragments of two 8-key tiles.
      float s[kNs][4];
#pragma unroll
      for (int nt = 0; nt < kNs; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kDk; ++kk) {
        unsigned a[4];
        if constexpr (QInRegs<D>::value) {
#pragma unroll
          for (int i = 0; i < 4; ++i) a[i] = qf[kk][i];
        } else {
          ldmatrix_x4(a, q_frag_row + 16 * kk);
        }
#pragma unroll
        for (int np = 0; np < kNs / 2; ++np) {
          unsigned kb[4];
          ldmatrix_x4(kb, Ks + 16 * np * L::kLd + k_frag_off + 16 * kk);
          const unsigned b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
          mma_m16n8k16<T>(s[2 * np], a, b0);
          mma_m16n8k16<T>(s[2 * np + 1], a, b1);
        }
      }

      // Scale to log2 units and soft-cap; mask keys past each row's last key (only
      // tiles that reach past the warp's first row can hold such keys, zero-filled
      // ones included) and keys older than its window (only tiles that start
      // before the warp's last row's window).
      const bool diagonal = kv0 + Bc - 1 > warp_first_pos;
      const bool window_edge = sliding_window > 0 && kv0 <= warp_last_pos - sliding_window;
#pragma unroll
      for (int nt = 0; nt < kNs; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int key = kv0 + 8 * nt + 2 * t + (i & 1);
          const bool hidden = (diagonal && key > row_last[i / 2]) ||
                              (window_edge && key <= row_pos[i / 2] - sliding_window);
          float x = s[nt][i] * scale_log2;
          if (soft_cap > 0.0f) x = cap_log2 * tanhf(x / cap_log2);
          s[nt][i] = hidden ? neg_inf() : x;
        }
      }

      // m_new = max(m, rowmax(S_ij)): the lane's columns, then the quad's 4 lanes.
      // -inf for a row that has seen no visible key yet (window): see m_ref below.
      float m_new[2] = {m[0], m[1]};
#pragma unroll
      for (int nt = 0; nt < kNs; ++nt) {
        m_new[0] = fmaxf(m_new[0], fmaxf(s[nt][0], s[nt][1]));
        m_new[1] = fmaxf(m_new[1], fmaxf(s[nt][2], s[nt][3]));
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        m_new[r] = fmaxf(m_new[r], __shfl_xor_sync(0xffffffffu, m_new[r], 1));
        m_new[r] = fmaxf(m_new[r], __shfl_xor_sync(0xffffffffu, m_new[r], 2));
      }

      // P_ij = 2^(S_ij - m_new); l = l 2^(m - m_new) + rowsum(P_ij) (this lane's
      // columns; the quad's parts are summed once, at the end); O_i *= 2^(m - m_new).
      // (While m_new = -inf, the reference is 0: every weight and l stay 0, not NaN.)
      float correction[2], m_ref[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        m_ref[r] = m_new[r] == neg_inf() ? 0.0f : m_new[r];
        correction[r] = exp2f(m[r] - m_ref[r]);
        l[r] *= correction[r];
        m[r] = m_new[r];
      }
#pragma unroll
      for (int nt = 0; nt < kNs; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          s[nt][i] = exp2f(s[nt][i] - m_ref[i / 2]);
          l[i / 2] += s[nt][i];
        }
      }
#pragma unroll
      for (int nt = 0; nt < kNo; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) o[nt][i] *= correction[i / 2];
      }

      // O_i += P_ij V_j: per 16 keys, P's A fragment is the S accumulators of
      // 8-key tiles 2kk and 2kk+1 rounded to T; one ldmatrix_x4_trans gives the
      // B fragments of two 8-column tiles of V.
#pragma unroll
      for (int kk = 0; kk < Bc / 16; ++kk) {
        const unsigned a[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                               pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                               pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int np = 0; np < kNo / 2; ++np) {
          unsigned vb[4];
          ldmatrix_x4_trans(vb, Vs + 16 * kk * L::kLd + v_frag_off + 16 * np);
          const unsigned b0[2] = {vb[0], vb[1]}, b1[2] = {vb[2], vb[3]};
          mma_m16n8k16<T>(o[2 * np], a, b0);
          mma_m16n8k16<T>(o[2 * np + 1], a, b1);
        }
      }
    }
    __syncthreads();  // every warp is done reading stage j%2 before iteration j+1 refills it
  }

  // O_i / l: sum the quad's parts of l, then each lane writes its two columns of
  // each 8-column tile, for its rows that are real.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = warp_row0 + g + 8 * r;
    if (row >= rows) continue;
    const float inv_l = v_scale / l[r];  // v_scale: 1 unless the cache is FP8
    unsigned* dst = reinterpret_cast<unsigned*>(out + (i64(q_begin + r0 + row) * num_heads + h) * D);
#pragma unroll
    for (int nt = 0; nt < kNo; ++nt) dst[4 * nt + t] = pack2<T>(o[nt][2 * r] * inv_l, o[nt][2 * r + 1] * inv_l);
  }
}

// Entry points: paged_attention_prefill_<dtype>[_fp8]_d<D>_bc<Bc>; the _fp8 ones
// read an e4m3 cache and take its scales.
#define PREFILL_ENTRY(T, C, suffix, D, Bc, KIND)                              \
  extern "C" __global__ void __launch_bounds__(prefill::kThreads)                              \
      paged_attention_prefill_##suffix##_d##D##_bc##Bc(                                        \
          T* out, const T* q, const C* k_cache, const C* v_cache, const int* block_tables,    \
          const int* seq_lens, const int* query_start_loc, int max_blocks, int num_kv_heads,  \
          int block_size, int q_stride, float scale, int smem_bytes, int sliding_window,      \
          float soft_cap, const int* key_end SCALES_PARAM_##KIND) {                            \
    paged_attention_prefill<T, C, D, Bc>(out, q, k_cache, v_cache, block_tables, seq_lens,    \
                                         query_start_loc, max_blocks, num_kv_heads,           \
                                         block_size, q_stride, scale, smem_bytes,             \
                                         sliding_window, soft_cap, key_end, SCALES_ARG_##KIND); \
  }

// KIND is NONE or FP8; pasted (never expanded as an argument), so that the
// FP8 parameter list can carry its comma.
#define SCALES_PARAM_NONE
#define SCALES_PARAM_FP8 , const float* kv_scales
#define SCALES_ARG_NONE nullptr
#define SCALES_ARG_FP8 kv_scales

// Key tile Bc per head size; rawpage/ops/paged_attention.py picks the same
// (prefill_key_tile) and computes the same shared memory size.
#define PREFILL_HEAD_SIZES(T, C, suffix, KIND) \
  PREFILL_ENTRY(T, C, suffix, 16, 64, KIND)    \
  PREFILL_ENTRY(T, C, suffix, 32, 64, KIND)    \
  PREFILL_ENTRY(T, C, suffix, 64, 64, KIND)    \
  PREFILL_ENTRY(T, C, suffix, 80, 64, KIND)    \
  PREFILL_ENTRY(T, C, suffix, 96, 64, KIND)    \
  PREFILL_ENTRY(T, C, suffix, 128, 64, KIND)   \
  PREFILL_ENTRY(T, C, suffix, 256, 32, KIND)

#define PREFILL_ENTRIES(T, suffix)                           \
  PREFILL_HEAD_SIZES(T, T, suffix, NONE) \
  PREFILL_HEAD_SIZES(T, fp8_e4m3, suffix##_fp8, FP8)

PREFILL_ENTRIES(__half, f16)
PREFILL_ENTRIES(__nv_bfloat16, bf16)
