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
// Image rows, as in paged_attention_prefill.cu: with key_end (not null) row r
// also sees the keys up to key_end[r] (its whole image), so the keys visited run
// to the furthest one any row of the tile sees and a row's mask is key > max(p, key_end[r]).
// Options (0 = off), as in paged_attention_prefill.cu: a sliding window W (row p
// sees keys p-W+1 .. p; tiles before the tile's first row's window are never
// loaded, keys before it never read), a soft cap c (S = c tanh(S / c)), and an
// FP8 cache (C = fp8_e4m3: converted on load, k_scale folded into the score
// scale, v_scale into 1 / l).
// Head size 256: Q_i stays in global memory (each lane reads its row there), so
// that K, V, S and O fit sm_80's shared memory.
//
// Grid: (ceil(max_query_len / Br), H, B): one block per query tile, head and
// sequence; tiles past a sequence's chunk exit at once.
// Block: 4 warps; warp w owns query rows 16w .. 16w+15 of the tile, its rows of
// S, P and O in shared memory, and the softmax state of those rows (two lanes
// per row). All warps share the K_j, V_j tiles.
#include "common.cuh"
#include "fp8.cuh"

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
  static constexpr bool kQInSmem = D <= 128;
  static constexpr int kBr = prefill_f32::kBr, kBc = prefill_f32::kBc;
  static constexpr int kLdT = D + 4;    // Q, K, V rows
  static constexpr int kLdS = kBc + 4;  // S (then P) rows
  static constexpr int kLdO = D + 4;    // O rows
  __host__ __device__ static constexpr int align(int bytes) { return (bytes + 127) / 128 * 128; }
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + (kQInSmem ? align(kBr * kLdT * 4) : 0);
  static constexpr int kV = kK + align(kBc * kLdT * 4);
  static constexpr int kS = kV + align(kBc * kLdT * 4);
  static constexpr int kO = kS + align(kBr * kLdS * 4);
  static constexpr int kBytes = kO + align(kBr * kLdO * 4);
};

// 4 cache elements at src as 4 floats (a 16-byte float4, or 4 bytes of e4m3 codes).
__device__ __forceinline__ float4 load4(const float* src) { return *reinterpret_cast<const float4*>(src); }
__device__ __forceinline__ float4 load4(const fp8_e4m3* src) {
  const unsigned codes = *reinterpret_cast<const unsigned*>(src);
  return make_float4(e4m3_to_float(codes & 0xFFu), e4m3_to_float((codes >> 8) & 0xFFu),
                     e4m3_to_float((codes >> 16) & 0xFFu), e4m3_to_float(codes >> 24));
}

template <int D, typename C>
__device__ void paged_attention_prefill_f32(
    float* __restrict__ out,                  // [T, H, D]
    const float* __restrict__ q,              // [T, H, D], token stride q_stride
    const C* __restrict__ k_cache,            // [NB, BS, Hkv, D], C = float or fp8_e4m3
    const C* __restrict__ v_cache,            // [NB, BS, Hkv, D]
    const int* __restrict__ block_tables,     // [B, max_blocks]
    const int* __restrict__ seq_lens,         // [B], context length including the chunk
    const int* __restrict__ query_start_loc,  // [B+1]
    int max_blocks, int num_kv_heads, int block_size, int q_stride, float scale, int smem_bytes,
    int sliding_window, float soft_cap,
    const int* __restrict__ key_end,        // [T] last key each row sees beyond its own, -1: none; null: causal
    const float* __restrict__ kv_scales) {  // [2] (k_scale, v_scale) for an FP8 cache, else null
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
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // keys [kv_begin, kv_end) are visible to some row: causally up to the last row, and
  // up to the furthest image key of any row
  int kv_end = pos0 + rows;
  if (key_end != nullptr) kv_end = min(max(kv_end, block_max_of(key_end + q_begin + r0, rows) + 1), seq_lens[b]);
  const int kv_begin = sliding_window > 0 ? max(0, pos0 - sliding_window + 1) : 0;
  const int kv_head = h / (num_heads / num_kv_heads);

  unsigned char* smem = dynamic_smem<unsigned char>();
  float* Qs = reinterpret_cast<float*>(smem + L::kQ);  // [Br][LdT]
  float* Ks = reinterpret_cast<float*>(smem + L::kK);  // [Bc][LdT]
  float* Vs = reinterpret_cast<float*>(smem + L::kV);  // [Bc][LdT]
  float* Ss = reinterpret_cast<float*>(smem + L::kS);  // [Br][LdS], S then P
  float* Os = reinterpret_cast<float*>(smem + L::kO);  // [Br][LdO]

  // Q_i: the tile's query rows for head h (rows past the chunk are zero); O_i = 0
  for (int c = threadIdx.x; L::kQInSmem && c < kBr * kChunks; c += kThreads) {
    const int r = c / kChunks, part = c % kChunks;
    float4 v = make_float4(0, 0, 0, 0);
    if (r < rows) v = reinterpret_cast<const float4*>(q + i64(q_begin + r0 + r) * q_stride + h * D)[part];
    reinterpret_cast<float4*>(Qs + r * L::kLdT)[part] = v;
  }
  for (int i = threadIdx.x; i < kBr * L::kLdO; i += kThreads) Os[i] = 0.0f;
  __syncthreads();  // Q_i and O_i are in shared memory before any warp multiplies

  // Lanes 2r and 2r+1 own row r of the warp's 16, each half of the columns.
  const int my_row = warp * 16 + lane / 2, half = lane % 2;
  const int my_pos = pos0 + my_row;  // this row sees keys 0 .. my_last
  int my_last = my_pos;
  float m = neg_inf(), l = 0.0f;
  const bool warp_has_rows = warp * 16 < rows;
  int warp_last_key = pos0 + min(warp * 16 + 15, rows - 1);  // the last key any of the warp's rows sees
  if (key_end != nullptr) {
    if (my_row < rows) {  // padding rows are never written
      my_last = max(my_pos, key_end[q_begin + r0 + my_row]);
      warp_last_key = max(warp_last_key, my_last);
    }
    warp_last_key = warp_max(warp_last_key);
  }
  // (At D = 256 a lane reads its row from q itself; rows past the chunk repeat the last.)
  const float* Q_row = L::kQInSmem ? Qs + my_row * L::kLdT
                                   : q + i64(q_begin + r0 + min(my_row, rows - 1)) * q_stride + h * D;
  float* S_row = Ss + my_row * L::kLdS;
  float* O_row = Os + my_row * L::kLdO;
  const float k_scale = kv_scales ? kv_scales[0] : 1.0f, v_scale = kv_scales ? kv_scales[1] : 1.0f;
  const float scale_log2 = scale * kLog2e * k_scale;
  const float cap_log2 = soft_cap * kLog2e;  // the soft cap in log2 units
  const int my_first_key = sliding_window > 0 ? my_pos - sliding_window + 1 : 0;  // this row's window
  const int warp_first_key = sliding_window > 0 ? pos0 + warp * 16 - sliding_window + 1 : 0;

  for (int kv0 = kv_begin / kBc * kBc; kv0 < kv_end; kv0 += kBc) {
    // K_j, V_j: keys kv0 .. kv0+Bc-1 through the block table; keys outside
    // [kv_begin, kv_end) are zero (a masked P = 0 must not meet garbage: 0 * NaN = NaN).
    for (int c = threadIdx.x; c < kBc * kChunks; c += kThreads) {
      const int r = c / kChunks, part = c % kChunks, t = kv0 + r;
      float4 kv = make_float4(0, 0, 0, 0), vv = make_float4(0, 0, 0, 0);
      if (t >= kv_begin && t < kv_end) {
        const int physical = block_tables[i64(b) * max_blocks + t / block_size];
        const i64 offset = ((i64(physical) * block_size + t % block_size) * num_kv_heads + kv_head) * D;
        kv = load4(k_cache + offset + 4 * part);
        vv = load4(v_cache + offset + 4 * part);
      }
      reinterpret_cast<float4*>(Ks + r * L::kLdT)[part] = kv;
      reinterpret_cast<float4*>(Vs + r * L::kLdT)[part] = vv;
    }
    __syncthreads();  // K_j, V_j are complete before any warp reads them

    // Warp-uniform: tiles past every key the warp's rows see, or before all their windows, skip.
    if (warp_has_rows && kv0 <= warp_last_key && kv0 + kBc - 1 >= warp_first_key) {
      // S_ij = Q_i K_j^T * scale (log2 units), soft-capped, masked; m_new = max(m, rowmax S_ij)
      float row_max = neg_inf();
      for (int c = half * (kBc / 2); c < (half + 1) * (kBc / 2); ++c) {
        float s = neg_inf();
        if (kv0 + c <= my_last && kv0 + c >= my_first_key) {
          float acc = 0.0f;
          for (int d = 0; d < D; ++d) acc += Q_row[d] * Ks[c * L::kLdT + d];
          s = acc * scale_log2;
          if (soft_cap > 0.0f) s = cap_log2 * tanhf(s / cap_log2);
        }
        S_row[c] = s;
        row_max = fmaxf(row_max, s);
      }
      row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 1));
      const float m_new = fmaxf(m, row_max);  // -inf while the row has seen no visible key
      const float m_ref = m_new == neg_inf() ? 0.0f : m_new;  // so that the weights are 0, not NaN
      // P_ij = 2^(S - m_new) in place of S; l = l 2^(m - m_new) + rowsum(P_ij)
      float row_sum = 0.0f;
      for (int c = half * (kBc / 2); c < (half + 1) * (kBc / 2); ++c) {
        const float p = exp2f(S_row[c] - m_ref);
        S_row[c] = p;
        row_sum += p;
      }
      row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 1);
      const float correction = exp2f(m - m_ref);
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
    const float inv_l = v_scale / l;  // v_scale: 1 unless the cache is FP8
    for (int d = half * (D / 2); d < (half + 1) * (D / 2); ++d) dst[d] = O_row[d] * inv_l;
  }
}

// Entry points: paged_attention_prefill_f32[_fp8]_d<D>_bc32; the _fp8 ones read an
// e4m3 cache and take its scales.
#define PREFILL_F32_ENTRY(C, suffix, D, KIND)                                       \
  extern "C" __global__ void __launch_bounds__(prefill_f32::kThreads, 2)                              \
      paged_attention_prefill_##suffix##_d##D##_bc32(                                                 \
          float* out, const float* q, const C* k_cache, const C* v_cache, const int* block_tables,   \
          const int* seq_lens, const int* query_start_loc, int max_blocks, int num_kv_heads,         \
          int block_size, int q_stride, float scale, int smem_bytes, int sliding_window,             \
          float soft_cap, const int* key_end SCALES_PARAM_##KIND) {                                   \
    paged_attention_prefill_f32<D, C>(out, q, k_cache, v_cache, block_tables, seq_lens,             \
                                      query_start_loc, max_blocks, num_kv_heads, block_size,        \
                                      q_stride, scale, smem_bytes, sliding_window, soft_cap, key_end, \
                                      SCALES_ARG_##KIND);                                           \
  }

// KIND is NONE or FP8; pasted (never expanded as an argument), so that the
// FP8 parameter list can carry its comma.
#define SCALES_PARAM_NONE
#define SCALES_PARAM_FP8 , const float* kv_scales
#define SCALES_ARG_NONE nullptr
#define SCALES_ARG_FP8 kv_scales
#define PREFILL_F32_HEAD_SIZES(C, suffix, KIND) \
  PREFILL_F32_ENTRY(C, suffix, 16, KIND)        \
  PREFILL_F32_ENTRY(C, suffix, 32, KIND)        \
  PREFILL_F32_ENTRY(C, suffix, 64, KIND)        \
  PREFILL_F32_ENTRY(C, suffix, 80, KIND)        \
  PREFILL_F32_ENTRY(C, suffix, 96, KIND)        \
  PREFILL_F32_ENTRY(C, suffix, 128, KIND)       \
  PREFILL_F32_ENTRY(C, suffix, 256, KIND)

PREFILL_F32_HEAD_SIZES(float, f32, NONE)
PREFILL_F32_HEAD_SIZES(fp8_e4m3, f32_fp8, FP8)
