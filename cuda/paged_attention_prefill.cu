// Paged attention for prefill: variable-length chunks of query tokens, causal,
// against the paged K/V of each sequence's context (the cached prefix plus the
// chunk itself, which write_kv has already stored).
//
// Sequence b owns query rows q[query_start_loc[b] : query_start_loc[b+1]]: the
// last n tokens of its L = seq_lens[b] tokens of context, so query row i sits at
// position L - n + i and sees keys 0 .. L - n + i.
//
// Tiled flash attention (Dao et al., Algorithm 1, in the paper's notation) for
// one query tile Q_i of Br rows and one head, looping over key tiles K_j, V_j of
// Bc keys gathered from the cache through the block table:
//   S_ij = Q_i K_j^T * scale                      (masked: key > query position -> -inf)
//   m_new = max(m, rowmax(S_ij))
//   P_ij = exp(S_ij - m_new)
//   l = l exp(m - m_new) + rowsum(P_ij)
//   O_i = O_i exp(m - m_new) + P_ij V_j
//   m = m_new
// and finally O_i / l. Scores are kept in log2 units so each exponential is exp2f.
//
// S = Q K^T and O += P V run on tensor cores through WMMA (16x16x16 tiles, float
// accumulation) for float16 and bfloat16; float32 uses plain FMAs with the same
// tiling, so that the float32 path is exact enough to debug against.
//
// In the forward pass: after write_kv, for any batch that holds a prefill chunk
// (decode rows in the same batch are handled here too, as 1-row chunks).
//
// Grid: (ceil(max_query_len / Br), H, B): one block per query tile, head and
// sequence; tiles past a sequence's chunk exit at once.
// Block: 4 warps; warp w owns query rows 16w .. 16w+15 of the tile, its slices
// of S, P and O, and the softmax state of those rows (two lanes per row). All
// warps share the K_j, V_j tiles in shared memory.
#include <mma.h>

#include "common.cuh"

using namespace rawpage;

namespace prefill {
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kBr = 16 * kWarps;  // query rows per block
constexpr float kLog2e = 1.4426950408889634f;
}  // namespace prefill

// Shared memory layout (dynamic; the launch code computes the same kBytes).
// Rows are padded so that the 16 rows a WMMA load touches start in different
// banks; WMMA wants ldm % 8 == 0 (16-bit) or % 4 (float) and 32-byte aligned
// tile pointers, which these pitches and 128-byte aligned regions give.
template <typename T, int D, int Bc>
struct PrefillSmem {
  static constexpr int kLdT = D + 8;   // Q, K, V rows (T)
  static constexpr int kLdS = Bc + 4;  // S rows (float)
  static constexpr int kLdP = Bc + 8;  // P rows (T)
  static constexpr int kLdO = D + 4;   // O rows (float)
  __host__ __device__ static constexpr int align(int bytes) { return (bytes + 127) / 128 * 128; }
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + align(prefill::kBr * kLdT * int(sizeof(T)));
  static constexpr int kV = kK + align(Bc * kLdT * int(sizeof(T)));
  static constexpr int kS = kV + align(Bc * kLdT * int(sizeof(T)));
  static constexpr int kP = kS + align(prefill::kBr * kLdS * 4);
  static constexpr int kO = kP + align(prefill::kBr * kLdP * int(sizeof(T)));
  static constexpr int kBytes = kO + align(prefill::kBr * kLdO * 4);
};

// S (16 x Bc, float) = Q (16 x D) K^T, where K holds Bc rows of D.
template <typename T, int D, int Bc, int LdT, int LdS>
__device__ __forceinline__ void warp_qk(const T* Q, const T* K, float* S) {
  if constexpr (is_same<T, float>::value) {
    for (int e = threadIdx.x % 32; e < 16 * Bc; e += 32) {
      const int r = e / Bc, c = e % Bc;
      float acc = 0.0f;
      for (int d = 0; d < D; ++d) acc += Q[r * LdT + d] * K[c * LdT + d];
      S[r * LdS + c] = acc;
    }
  } else {
    using namespace nvcuda;
#pragma unroll
    for (int c = 0; c < Bc / 16; ++c) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> s;
      wmma::fill_fragment(s, 0.0f);
#pragma unroll
      for (int k = 0; k < D / 16; ++k) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> kt;  // K^T: K read column-major
        wmma::load_matrix_sync(a, Q + k * 16, LdT);
        wmma::load_matrix_sync(kt, K + c * 16 * LdT + k * 16, LdT);
        wmma::mma_sync(s, a, kt, s);
      }
      wmma::store_matrix_sync(S + c * 16, s, LdS, wmma::mem_row_major);
    }
  }
}

// O (16 x D, float, in place) += P (16 x Bc) V, where V holds Bc rows of D.
template <typename T, int D, int Bc, int LdT, int LdP, int LdO>
__device__ __forceinline__ void warp_pv(const T* P, const T* V, float* O) {
  if constexpr (is_same<T, float>::value) {
    for (int e = threadIdx.x % 32; e < 16 * D; e += 32) {
      const int r = e / D, d = e % D;
      float acc = O[r * LdO + d];
      for (int c = 0; c < Bc; ++c) acc += P[r * LdP + c] * V[c * LdT + d];
      O[r * LdO + d] = acc;
    }
  } else {
    using namespace nvcuda;
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> o;
      wmma::load_matrix_sync(o, O + n * 16, LdO, wmma::mem_row_major);
#pragma unroll
      for (int k = 0; k < Bc / 16; ++k) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> v;
        wmma::load_matrix_sync(a, P + k * 16, LdP);
        wmma::load_matrix_sync(v, V + k * 16 * LdT + n * 16, LdT);
        wmma::mma_sync(o, a, v, o);
      }
      wmma::store_matrix_sync(O + n * 16, o, LdO, wmma::mem_row_major);
    }
  }
}

template <typename T, int D, int Bc>
__device__ void paged_attention_prefill(
    T* __restrict__ out,                      // [T, H, D]
    const T* __restrict__ q,                  // [T, H, D], token stride q_stride
    const T* __restrict__ k_cache,            // [NB, BS, Hkv, D]
    const T* __restrict__ v_cache,            // [NB, BS, Hkv, D]
    const int* __restrict__ block_tables,     // [B, max_blocks]
    const int* __restrict__ seq_lens,         // [B], context length including the chunk
    const int* __restrict__ query_start_loc,  // [B+1]
    int max_blocks, int num_kv_heads, int block_size, int q_stride, float scale,
    int smem_bytes) {  // the launch's dynamic shared memory, checked against the layout
  using namespace prefill;
  using L = PrefillSmem<T, D, Bc>;
  constexpr int kChunks = D * int(sizeof(T)) / 16;  // 16-byte chunks per head vector
  if (smem_bytes < L::kBytes) __trap();             // a launch-code bug, not a data error

  const int tile = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int num_heads = gridDim.y;
  const int q_begin = query_start_loc[b], n = query_start_loc[b + 1] - q_begin;
  const int r0 = tile * kBr;
  if (r0 >= n) return;  // this sequence's chunk has fewer tiles than the longest one
  const int rows = min(kBr, n - r0);                // real query rows in the tile
  const int pos0 = seq_lens[b] - n + r0;            // position of the tile's first row
  const int kv_end = pos0 + rows;                   // keys [0, kv_end) are visible to some row
  const int kv_head = h / (num_heads / num_kv_heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  unsigned char* smem = dynamic_smem<unsigned char>();
  T* Qs = reinterpret_cast<T*>(smem + L::kQ);      // [Br][LdT]
  T* Ks = reinterpret_cast<T*>(smem + L::kK);      // [Bc][LdT]
  T* Vs = reinterpret_cast<T*>(smem + L::kV);      // [Bc][LdT]
  float* Ss = reinterpret_cast<float*>(smem + L::kS);  // [Br][LdS]
  T* Ps = reinterpret_cast<T*>(smem + L::kP);      // [Br][LdP]
  float* Os = reinterpret_cast<float*>(smem + L::kO);  // [Br][LdO]

  // Q_i: the tile's query rows for head h (rows past the chunk are zero); O_i = 0
  for (int c = threadIdx.x; c < kBr * kChunks; c += kThreads) {
    const int r = c / kChunks, part = c % kChunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < rows) v = reinterpret_cast<const uint4*>(q + i64(q_begin + r0 + r) * q_stride + h * D)[part];
    reinterpret_cast<uint4*>(Qs + r * L::kLdT)[part] = v;
  }
  for (int i = threadIdx.x; i < kBr * L::kLdO; i += kThreads) Os[i] = 0.0f;
  __syncthreads();  // Q_i and O_i are in shared memory before any warp multiplies

  // Softmax state of one row, held by two lanes: lane 2r and 2r+1 own row r of
  // the warp's 16 and each takes half of the columns.
  const int my_row = warp * 16 + lane / 2, half = lane % 2;
  const int my_pos = pos0 + my_row;  // this row sees keys 0 .. my_pos
  float m = neg_inf(), l = 0.0f;
  // Warps whose rows are all padding, and key tiles that lie wholly in the
  // future of every row of the warp, skip the math (the conditions are
  // warp-uniform; every warp still reaches each __syncthreads).
  const bool warp_has_rows = warp * 16 < rows;
  const int warp_last_pos = pos0 + min(warp * 16 + 15, rows - 1);
  float* S_row = Ss + my_row * L::kLdS;
  T* P_row = Ps + my_row * L::kLdP;
  float* O_row = Os + my_row * L::kLdO;

  for (int kv0 = 0; kv0 < kv_end; kv0 += Bc) {
    // K_j, V_j: keys kv0 .. kv0+Bc-1 gathered through the block table. Keys at or
    // past kv_end are zero, so that a masked P = 0 never meets garbage in V
    // (0 * NaN = NaN), and block table entries past the context are never read.
    for (int c = threadIdx.x; c < Bc * kChunks; c += kThreads) {
      const int r = c / kChunks, part = c % kChunks, t = kv0 + r;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
      if (t < kv_end) {
        const int physical = block_tables[i64(b) * max_blocks + t / block_size];
        const i64 offset = ((i64(physical) * block_size + t % block_size) * num_kv_heads + kv_head) * D;
        kv = reinterpret_cast<const uint4*>(k_cache + offset)[part];
        vv = reinterpret_cast<const uint4*>(v_cache + offset)[part];
      }
      reinterpret_cast<uint4*>(Ks + r * L::kLdT)[part] = kv;
      reinterpret_cast<uint4*>(Vs + r * L::kLdT)[part] = vv;
    }
    __syncthreads();  // K_j, V_j are complete before any warp reads them

    if (warp_has_rows && kv0 <= warp_last_pos) {
      // S_ij = Q_i K_j^T for this warp's 16 rows
      warp_qk<T, D, Bc, L::kLdT, L::kLdS>(Qs + warp * 16 * L::kLdT, Ks, Ss + warp * 16 * L::kLdS);
      __syncwarp();  // S rows stored by the warp's MMA are visible to the lanes reading them

      // m_new = max(m, rowmax(S * scale)), with keys past my_pos masked to -inf
      const float scale_log2 = scale * kLog2e;
      float row_max = neg_inf();
      for (int c = half * (Bc / 2); c < (half + 1) * (Bc / 2); ++c)
        if (kv0 + c <= my_pos) row_max = fmaxf(row_max, S_row[c] * scale_log2);
      row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 1));
      // Every row sees key 0, which is in the first tile, so m_new is finite.
      const float m_new = fmaxf(m, row_max);
      // P_ij = 2^(S - m_new), l = l 2^(m - m_new) + rowsum(P_ij)
      float row_sum = 0.0f;
      for (int c = half * (Bc / 2); c < (half + 1) * (Bc / 2); ++c) {
        const float p = kv0 + c <= my_pos ? exp2f(S_row[c] * scale_log2 - m_new) : 0.0f;
        P_row[c] = from_float<T>(p);
        row_sum += p;
      }
      row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 1);
      const float correction = exp2f(m - m_new);
      l = l * correction + row_sum;
      m = m_new;
      // O_i = O_i 2^(m - m_new), this lane's half of the row
      for (int d = half * (D / 2); d < (half + 1) * (D / 2); ++d) O_row[d] *= correction;
      __syncwarp();  // P and the rescaled O are visible to the warp's MMA

      // O_i += P_ij V_j
      warp_pv<T, D, Bc, L::kLdT, L::kLdP, L::kLdO>(Ps + warp * 16 * L::kLdP, Vs,
                                                   Os + warp * 16 * L::kLdO);
    }
    __syncthreads();  // every warp is done with K_j, V_j (and its O stores) before the next tile
  }

  // O_i / l, for the real rows
  if (my_row < rows) {
    T* dst = out + (i64(q_begin + r0 + my_row) * num_heads + h) * D;
    const float inv_l = 1.0f / l;
    for (int d = half * (D / 2); d < (half + 1) * (D / 2); ++d) dst[d] = from_float<T>(O_row[d] * inv_l);
  }
}

#define PREFILL_ENTRY(T, suffix, D, Bc)                                                        \
  extern "C" __global__ void __launch_bounds__(prefill::kThreads, 2)                           \
      paged_attention_prefill_##suffix##_d##D##_bc##Bc(                                        \
          T* out, const T* q, const T* k_cache, const T* v_cache, const int* block_tables,    \
          const int* seq_lens, const int* query_start_loc, int max_blocks, int num_kv_heads,  \
          int block_size, int q_stride, float scale, int smem_bytes) {                        \
    paged_attention_prefill<T, D, Bc>(out, q, k_cache, v_cache, block_tables, seq_lens,       \
                                      query_start_loc, max_blocks, num_kv_heads, block_size,  \
                                      q_stride, scale, smem_bytes);                           \
  }

// Key tile Bc per dtype and head size; rawpage/ops/paged_attention.py picks the
// same (prefill_key_tile) and computes the same shared memory size.
#define PREFILL_ENTRIES_16BIT(T, suffix) \
  PREFILL_ENTRY(T, suffix, 16, 64)       \
  PREFILL_ENTRY(T, suffix, 32, 64)       \
  PREFILL_ENTRY(T, suffix, 64, 64)       \
  PREFILL_ENTRY(T, suffix, 80, 64)       \
  PREFILL_ENTRY(T, suffix, 96, 64)       \
  PREFILL_ENTRY(T, suffix, 128, 64)      \
  PREFILL_ENTRY(T, suffix, 256, 32)

PREFILL_ENTRIES_16BIT(__half, f16)
PREFILL_ENTRIES_16BIT(__nv_bfloat16, bf16)
PREFILL_ENTRY(float, f32, 16, 32)
PREFILL_ENTRY(float, f32, 32, 32)
PREFILL_ENTRY(float, f32, 64, 32)
PREFILL_ENTRY(float, f32, 80, 32)
PREFILL_ENTRY(float, f32, 96, 32)
PREFILL_ENTRY(float, f32, 128, 32)
