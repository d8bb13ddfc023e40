// Paged attention for prefill in float32: the same inputs, math and result as
// paged_attention_prefill.cu, without tensor cores (they take 16-bit inputs), so
// that the float32 engine (sim and CPU-parity runs) stays exact to ~1e-6.
// It is the pre-tensor-core kernel's float path, kept simple on purpose: see
// paged_attention_prefill.cu for the fast float16/bfloat16 design.
//
// Tiled flash attention (Dao et al., Algorithm 1) for one query tile Q_i of Br
// rows and one head, over key tiles K_j, V_j of Bc keys gathered through the
// block table, scores in log2 units:
//   S_ij = Q_i K_j^T * scale * log2(e)             (key > query position -> -inf)
//   m_new = max(m, rowmax(S_ij));  P_ij = 2^(S_ij - m_new)
//   l = l 2^(m - m_new) + rowsum(P_ij);  O_i = O_i 2^(m - m_new) + P_ij V_j;  m = m_new
// and finally O_i / l.
//
// Grid: (ceil(max_query_len / Br), H, B): one block per query tile, head and
// sequence; tiles past a sequence's chunk exit at once.
// Block: 4 warps; warp w owns query rows 16w .. 16w+15 of the tile, its rows of
// S, P and O in shared memory, and the softmax state of those rows (two lanes
// per row). All warps share the K_j, V_j tiles.
#include "common.cuh"

using namespace rawpage;

namespace prefill_f32 {
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kBr = 16 * kWarps;  // query rows per block
constexpr int kBc = 32;           // keys per tile
constexpr float kLog2e = 1.4426950408889634f;
}  // namespace prefill_f32

// Shared memory (dynamic; prefill_smem_bytes in the launch code computes the same).
template <int D>
struct PrefillF32Smem {
  static constexpr int kBr = prefill_f32::kBr, kBc = prefill_f32::kBc;
  static constexpr int kLdT = D + 4;    // Q, K, V rows
  static constexpr int kLdS = kBc + 4;  // S (then P) rows
  static constexpr int kLdO = D + 4;    // O rows
  __host__ __device__ static constexpr int align(int bytes) { return (bytes + 127) / 128 * 128; }
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + align(kBr * kLdT * 4);
  static constexpr int kV = kK + align(kBc * kLdT * 4);
  static constexpr int kS = kV + align(kBc * kLdT * 4);
  static constexpr int kO = kS + align(kBr * kLdS * 4);
  static constexpr int kBytes = kO + align(kBr * kLdO * 4);
};

template <int D>
__device__ void paged_attention_prefill_f32(
    float* __restrict__ out,                  // [T, H, D]
    const float* __restrict__ q,              // [T, H, D], token stride q_stride
    const float* __restrict__ k_cache,        // [NB, BS, Hkv, D]
    const float* __restrict__ v_cache,        // [NB, BS, Hkv, D]
    const int* __restrict__ block_tables,     // [B, max_blocks]
    const int* __restrict__ seq_lens,         // [B], context length including the chunk
    const int* __restrict__ query_start_loc,  // [B+1]
    int max_blocks, int num_kv_heads, int block_size, int q_stride, float scale, int smem_bytes) {
  using namespace prefill_f32;
  using L = PrefillF32Smem<D>;
  constexpr int kChunks = D / 4;         // 16-byte chunks per head vector
  if (smem_bytes < L::kBytes) __trap();  // a launch-code bug, not a data error

  const int tile = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int num_heads = gridDim.y;
  const int q_begin = query_start_loc[b], n = query_start_loc[b + 1] - q_begin;
  const int r0 = tile * kBr;
  if (r0 >= n) return;  // this sequence's chunk has fewer tiles than the longest one
  const int rows = min(kBr, n - r0);      // real query rows in the tile
  const int pos0 = seq_lens[b] - n + r0;  // position of the tile's first row
  const int kv_end = pos0 + rows;         // keys [0, kv_end) are visible to some row
  const int kv_head = h / (num_heads / num_kv_heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  unsigned char* smem = dynamic_smem<unsigned char>();
  float* Qs = reinterpret_cast<float*>(smem + L::kQ);  // [Br][LdT]
  float* Ks = reinterpret_cast<float*>(smem + L::kK);  // [Bc][LdT]
  float* Vs = reinterpret_cast<float*>(smem + L::kV);  // [Bc][LdT]
  float* Ss = reinterpret_cast<float*>(smem + L::kS);  // [Br][LdS], S then P
  float* Os = reinterpret_cast<float*>(smem + L::kO);  // [Br][LdO]

  // Q_i: the tile's query rows for head h (rows past the chunk are zero); O_i = 0
  for (int c = threadIdx.x; c < kBr * kChunks; c += kThreads) {
    const int r = c / kChunks, part = c % kChunks;
    float4 v = make_float4(0, 0, 0, 0);
    if (r < rows) v = reinterpret_cast<const float4*>(q + i64(q_begin + r0 + r) * q_stride + h * D)[part];
    reinterpret_cast<float4*>(Qs + r * L::kLdT)[part] = v;
  }
  for (int i = threadIdx.x; i < kBr * L::kLdO; i += kThreads) Os[i] = 0.0f;
  __syncthreads();  // Q_i and O_i are in shared memory before any warp multiplies

  // Lanes 2r and 2r+1 own row r of the warp's 16, each half of the columns.
  const int my_row = warp * 16 + lane / 2, half = lane % 2;
  const int my_pos = pos0 + my_row;  // this row sees keys 0 .. my_pos
  float m = neg_inf(), l = 0.0f;
  const bool warp_has_rows = warp * 16 < rows;
  const int warp_last_pos = pos0 + min(warp * 16 + 15, rows - 1);
  const float* Q_row = Qs + my_row * L::kLdT;
  float* S_row = Ss + my_row * L::kLdS;
  float* O_row = Os + my_row * L::kLdO;
  const float scale_log2 = scale * kLog2e;

  for (int kv0 = 0; kv0 < kv_end; kv0 += kBc) {
    // K_j, V_j: keys kv0 .. kv0+Bc-1 through the block table; keys at or past
    // kv_end are zero (a masked P = 0 must not meet garbage: 0 * NaN = NaN).
    for (int c = threadIdx.x; c < kBc * kChunks; c += kThreads) {
      const int r = c / kChunks, part = c % kChunks, t = kv0 + r;
      float4 kv = make_float4(0, 0, 0, 0), vv = make_float4(0, 0, 0, 0);
      if (t < kv_end) {
        const int physical = block_tables[i64(b) * max_blocks + t / block_size];
        const i64 offset = ((i64(physical) * block_size + t % block_size) * num_kv_heads + kv_head) * D;
        kv = reinterpret_cast<const float4*>(k_cache + offset)[part];
        vv = reinterpret_cast<const float4*>(v_cache + offset)[part];
      }
      reinterpret_cast<float4*>(Ks + r * L::kLdT)[part] = kv;
      reinterpret_cast<float4*>(Vs + r * L::kLdT)[part] = vv;
    }
    __syncthreads();  // K_j, V_j are complete before any warp reads them

    if (warp_has_rows && kv0 <= warp_last_pos) {  // warp-uniform: tiles in the warp's future skip
      // S_ij = Q_i K_j^T * scale (log2 units), masked; m_new = max(m, rowmax S_ij)
      float row_max = neg_inf();
      for (int c = half * (kBc / 2); c < (half + 1) * (kBc / 2); ++c) {
        float s = neg_inf();
        if (kv0 + c <= my_pos) {
          float acc = 0.0f;
          for (int d = 0; d < D; ++d) acc += Q_row[d] * Ks[c * L::kLdT + d];
          s = acc * scale_log2;
        }
        S_row[c] = s;
        row_max = fmaxf(row_max, s);
      }
      row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 1));
      const float m_new = fmaxf(m, row_max);  // finite: every row sees key 0, in the first tile
      // P_ij = 2^(S - m_new) in place of S; l = l 2^(m - m_new) + rowsum(P_ij)
      float row_sum = 0.0f;
      for (int c = half * (kBc / 2); c < (half + 1) * (kBc / 2); ++c) {
        const float p = exp2f(S_row[c] - m_new);
        S_row[c] = p;
        row_sum += p;
      }
      row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 1);
      const float correction = exp2f(m - m_new);
      l = l * correction + row_sum;
      m = m_new;
      __syncwarp();  // both lanes' halves of P are written before either reads the whole row
      // O_i = O_i 2^(m - m_new) + P_ij V_j, this lane's half of the row's columns
      for (int d = half * (D / 2); d < (half + 1) * (D / 2); ++d) {
        float acc = O_row[d] * correction;
        for (int c = 0; c < kBc; ++c) acc += S_row[c] * Vs[c * L::kLdT + d];
        O_row[d] = acc;
      }
      __syncwarp();  // P is read by both lanes before the next tile overwrites it
    }
    __syncthreads();  // every warp is done with K_j, V_j before the next tile replaces them
  }

  // O_i / l, for the real rows
  if (my_row < rows) {
    float* dst = out + (i64(q_begin + r0 + my_row) * num_heads + h) * D;
    const float inv_l = 1.0f / l;
    for (int d = half * (D / 2); d < (half + 1) * (D / 2); ++d) dst[d] = O_row[d] * inv_l;
  }
}

#define PREFILL_F32_ENTRY(D)                                                                         \
  extern "C" __global__ void __launch_bounds__(prefill_f32::kThreads, 2)                              \
      paged_attention_prefill_f32_d##D##_bc32(float* out, const float* q, const float* k_cache,      \
                                              const float* v_cache, const int* block_tables,         \
                                              const int* seq_lens, const int* query_start_loc,       \
                                              int max_blocks, int num_kv_heads, int block_size,      \
                                              int q_stride, float scale, int smem_bytes) {           \
    paged_attention_prefill_f32<D>(out, q, k_cache, v_cache, block_tables, seq_lens,                 \
                                   query_start_loc, max_blocks, num_kv_heads, block_size, q_stride, \
                                   scale, smem_bytes);                                               \
  }

// Head sizes up to 128 (rawpage/ops/paged_attention.py refuses 256 in float32).
PREFILL_F32_ENTRY(16)
PREFILL_F32_ENTRY(32)
PREFILL_F32_ENTRY(64)
PREFILL_F32_ENTRY(80)
PREFILL_F32_ENTRY(96)
PREFILL_F32_ENTRY(128)
