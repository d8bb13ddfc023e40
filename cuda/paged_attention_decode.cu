// Paged attention for decode: one new query token per sequence, against the
// keys and values of its whole context, which live in blocks of the paged cache.
//
//   s_j = (q . k_j) * scale           for the context's tokens j = 0 .. L-1
//   o   = sum_j softmax(s)_j v_j
//
// Two options some families need, and an FP8 cache:
//   sliding window W > 0 (Mistral, Gemma's local layers): the query at position
//     L - 1 sees keys lo = max(0, L - W) .. L - 1 only; partitions split that
//     range, and blocks before it are never read (they may be freed: their table
//     entries are then a sentinel the kernel must not touch).
//   soft cap c > 0 (Gemma 2):  s_j = c * tanh(s_j / c)
//   FP8 (e4m3) cache, C = fp8_e4m3: k_j = k_scale * e4m3(k_j) (V likewise); the
//     scales fold into q (q * k_scale) and into the output (o * v_scale), so the
//     loop converts each element with to_float() and nothing else changes.
//
// Token j of sequence b sits in physical block block_tables[b, j / BS], at
// offset j % BS. With GQA, query heads h = kv * G' .. kv * G' + G' - 1 all read
// KV head kv (G' = H / Hkv). Decode is bound by reading K and V, so one block
// serves a KV head's whole group: each K/V byte crosses the memory bus once,
// and the G' dot products and G' output updates reuse it from registers.
//
// Split-K (flash-decoding): the visible context (lo .. L-1, L' = L - lo tokens)
// is cut into partitions of ps = max(min_partition, roundup(ceil(L' / P), 16))
// tokens, L' the sequence's own: a CUDA graph captured with P chosen for the longest context still
// spreads a shorter context over up to P partitions, but none so short that
// writing and merging its partial output costs more than reading its K/V.
// Each block reduces its partition to (m, l, o): the maximum score, the softmax
// denominator relative to it, and the normalized output.
// paged_attention_decode_reduce then merges the partitions:
//   M = max_p m_p,   w_p = l_p 2^(m_p - M),   o = sum_p w_p o_p / sum_p w_p
// With P = 1 the first kernel writes the output itself. Scores are kept in log2
// units (s * log2(e)), so that every exponential is one exp2f.
//
// In the forward pass: after write_kv, when every sequence in the batch decodes
// (a batch with any prefill goes to paged_attention_prefill.cu).
//
// Grid: (Hkv * chunks, B, P): one block per KV head (and chunk of G query heads
// when the group is larger than G = 8), sequence and partition.
// Block: 4 warps of `slots`: a slot is kLanes lanes that share one key; each lane
// holds VEC = D / kLanes consecutive elements of the key and value rows, which
// it loads as 16-byte vectors (kLanes = D * sizeof(C) / 16 when that is a power
// of two up to 32, else 8 with narrower loads: D = 80, 96), and of q and the
// output of every head of the group. A warp takes kKeysPerStep consecutive
// keys per step; the 4 warps interleave steps.
// While a warp computes the scores of one step, the V rows of that step and
// then the K rows of the next are already on their way (register double buffer).
#include "common.cuh"
#include "fp8.cuh"

using namespace rawpage;

namespace decode {
constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kPartitionAlign = 16;  // partitions are a multiple of this many tokens
constexpr float kLog2e = 1.4426950408889634f;

// Lanes sharing one key: one 16-byte vector each where the row allows it.
template <typename T, int D>
__host__ __device__ constexpr int lanes_per_key() {
  constexpr int chunks = D * int(sizeof(T)) / 16;
  constexpr bool power_of_two = D * int(sizeof(T)) % 16 == 0 && (chunks & (chunks - 1)) == 0;
  return power_of_two ? (chunks < 32 ? chunks : 32) : 8;
}

// Blocks per SM that ptxas must leave room for (__launch_bounds__): 4, i.e. at
// most 128 registers a thread, where the accumulators fit that without spilling
// (16-bit K/V in 16-byte vectors, groups up to 4); else 2.
template <typename C, int D, int G>
__host__ __device__ constexpr int min_blocks() {
  return sizeof(C) == 2 && G <= 4 && lanes_per_key<C, D>() != 8 ? 4 : 2;
}

// Tokens per partition for a sequence of seq_len tokens split up to P ways; the
// reduce kernel recomputes it the same way.
__device__ __forceinline__ int partition_tokens(int seq_len, int num_partitions,
                                                int min_partition) {
  const int even = ceil_div(ceil_div(seq_len, num_partitions), kPartitionAlign) * kPartitionAlign;
  return max(min_partition, even);
}

// N elements of T as they sit in memory, held in registers until used: loading
// into this issues the loads without waiting for them.
template <typename T, int N>
struct RawRow {
  using IO = VecIO<T, N>;
  typename IO::C c[N / IO::kPer];
  // The row at base + offset, or zeros where offset < 0 (a key past the end).
  __device__ __forceinline__ void load_or_zero(const T* __restrict__ base, i64 offset) {
#pragma unroll
    for (int i = 0; i < N / IO::kPer; ++i)
      c[i] = offset >= 0 ? reinterpret_cast<const typename IO::C*>(base + offset)[i]
                         : typename IO::C{};
  }
  __device__ __forceinline__ float operator[](int i) const {
    return to_float(reinterpret_cast<const T*>(c)[i]);
  }
};
}  // namespace decode

template <typename T, typename C, int D, int G>
__device__ void paged_attention_decode(
    T* __restrict__ out,                      // [T, H, D], written when P == 1
    float* __restrict__ part_o,               // [B, H, P, D] normalized partition outputs (P > 1)
    float* __restrict__ part_ml,              // [B, H, P, 2] (max, sum) in log2 units (P > 1)
    const T* __restrict__ q,                  // [T, H, D], token stride q_stride
    const C* __restrict__ k_cache,            // [NB, BS, Hkv, D], C = T or fp8_e4m3
    const C* __restrict__ v_cache,            // [NB, BS, Hkv, D]
    const int* __restrict__ block_tables,     // [B, max_blocks]
    const int* __restrict__ seq_lens,         // [B], context length including the new token
    const int* __restrict__ query_start_loc,  // [B+1]: sequence b's query is row query_start_loc[b]
    int max_blocks, int num_heads, int num_kv_heads, int block_size, int q_stride, float scale,
    int min_partition,
    int sliding_window,                 // W > 0: keys L-W .. L-1 only; 0: the whole context
    float soft_cap,                     // c > 0: s = c tanh(s / c); 0: none
    const float* __restrict__ kv_scales) {  // [2] (k_scale, v_scale) for an FP8 cache, else null
  using namespace decode;
  constexpr int kLanes = lanes_per_key<C, D>();
  constexpr int VEC = D / kLanes;
  constexpr int kSlots = 32 / kLanes;                        // keys side by side in a warp
  // Keys per slot and step: fewer when registers go to more heads, and at most
  // 32 keys per warp step, so that the step's table entries fit in one warp.
  constexpr int kKeysWanted = G >= 4 ? 2 : 4;
  constexpr int kKeysPerSlot = kKeysWanted * kSlots <= 32 ? kKeysWanted : 32 / kSlots;
  constexpr int kKeysPerStep = kSlots * kKeysPerSlot;

  const int group = num_heads / num_kv_heads, chunks = ceil_div(group, G);
  const int kv_head = blockIdx.x / chunks;
  const int h0 = kv_head * group + blockIdx.x % chunks * G;  // this block's first query head
  const int heads = min(G, kv_head * group + group - h0);    // and how many it serves
  const int b = blockIdx.y, p = blockIdx.z, num_partitions = gridDim.z;
  // The sequence's length and query row, read once and shared (rather than
  // loaded by all 128 threads).
  __shared__ int meta_s[3];
  if (threadIdx.x < 3)
    meta_s[threadIdx.x] = threadIdx.x == 0 ? seq_lens[b] : query_start_loc[b + threadIdx.x - 1];
  __syncthreads();  // meta_s written before anyone reads it
  const int seq_len = meta_s[0], row = meta_s[1];
  if (meta_s[2] == row) return;  // no new token this step
  const int lo = sliding_window > 0 ? max(0, seq_len - sliding_window) : 0;  // first visible key
  const int ps = partition_tokens(seq_len - lo, num_partitions, min_partition);
  const int start = lo + p * ps;
  if (start >= seq_len) return;  // past this sequence's end: the reduce never reads it
  const int end = min(start + ps, seq_len);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int slot = lane / kLanes, r = lane % kLanes;
  const int* table = block_tables + i64(b) * max_blocks;

  // Stage q_g * scale * log2(e) (* k_scale) for the group's heads (contiguous in q)
  // in shared memory, read once in 16-byte vectors; heads past `heads` are zero.
  const float k_scale = kv_scales ? kv_scales[0] : 1.0f, v_scale = kv_scales ? kv_scales[1] : 1.0f;
  const float q_factor = scale * kLog2e * k_scale;
  const float cap_log2 = soft_cap * kLog2e;  // the soft cap in the log2 units of the scores
  constexpr int kQVec = 16 / int(sizeof(T));
  __shared__ __align__(16) float q_s[G][D];
  float* q_flat = &q_s[0][0];  // [G * D]
  for (int i = threadIdx.x * kQVec; i < G * D; i += kThreads * kQVec) {
    float v[kQVec];
    if (i < heads * D) {
      load_floats<T, kQVec>(q + i64(row) * q_stride + h0 * D + i, v);
    } else {
#pragma unroll
      for (int e = 0; e < kQVec; ++e) v[e] = 0.0f;
    }
#pragma unroll
    for (int e = 0; e < kQVec; ++e) q_flat[i + e] = v[e] * q_factor;
  }
  __syncthreads();  // q_s complete before any lane copies its slice
  // This lane's slice of q: in registers while they are few; past 32 floats
  // (large groups) the dot products read it from shared memory instead, so
  // that registers go to the accumulators and blocks stay resident.
  constexpr bool kQInRegisters = G * VEC <= 32;
  constexpr int kQG = kQInRegisters ? G : 1, kQV = kQInRegisters ? VEC : 1;
  float q_r[kQG][kQV];
#pragma unroll
  for (int g = 0; g < kQG; ++g)
#pragma unroll
    for (int i = 0; i < kQV; ++i) q_r[g][i] = q_s[g][r * VEC + i];
  auto q_at = [&](int g, int i) {
    return kQInRegisters ? q_r[g % kQG][i % kQV] : q_s[g][r * VEC + i];
  };

  // The cache offset of this lane's slice of key j (-1: past `end`). The step's
  // keys span a few table entries; lane e reads entry e and a shuffle hands each
  // lane the one it needs, so every entry is one 4-byte load per step. BS is a
  // power of two (the launch checks), so j / BS and j % BS are a shift and a mask.
  const int bs_shift = __ffs(block_size) - 1, bs_mask = block_size - 1;
  auto offsets = [&](int base, i64* off) {
    const int first_block = base >> bs_shift;
    const int last_block = (min(base + kKeysPerStep, end) - 1) >> bs_shift;
    const int entry = lane <= last_block - first_block ? table[first_block + lane] : 0;
#pragma unroll
    for (int t = 0; t < kKeysPerSlot; ++t) {
      const int j = base + t * kSlots + slot;
      const int src = (min(j, end - 1) >> bs_shift) - first_block;
      const int physical = __shfl_sync(0xffffffffu, entry, src);
      const i64 slot_in_cache = (i64(physical) << bs_shift) + (j & bs_mask);
      off[t] = j < end ? (slot_in_cache * num_kv_heads + kv_head) * D + r * VEC : -1;
    }
  };

  // Online softmax per head over this slot's keys: running max m, denominator l
  // and unnormalized output acc, all relative to m.
  float m[G], l[G], acc[G][VEC];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = neg_inf();
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[g][i] = 0.0f;
  }

  RawRow<C, VEC> k_raw[kKeysPerSlot], v_raw[kKeysPerSlot];
  i64 off[kKeysPerSlot];
  constexpr int kStride = kWarps * kKeysPerStep;  // tokens between a warp's steps
  int base = start + warp * kKeysPerStep;
  if (base < end) {
    offsets(base, off);
#pragma unroll
    for (int t = 0; t < kKeysPerSlot; ++t) k_raw[t].load_or_zero(k_cache, off[t]);
  }
  // base is the same for the whole warp, so every shuffle below has all 32 lanes.
  for (; base < end; base += kStride) {
#pragma unroll
    for (int t = 0; t < kKeysPerSlot; ++t) v_raw[t].load_or_zero(v_cache, off[t]);

    // s_tg = q_g . k_t: each lane's partial dot product, summed over the slot's
    // lanes; then soft-capped: (c log2 e) tanh(s / (c log2 e)) is c tanh(s / c) in log2 units.
    float s[kKeysPerSlot][G];
#pragma unroll
    for (int t = 0; t < kKeysPerSlot; ++t)
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float x = 0.0f;
#pragma unroll
        for (int i = 0; i < VEC; ++i) x += q_at(g, i) * k_raw[t][i];
#pragma unroll
        for (int o = kLanes / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
        if (soft_cap > 0.0f) x = cap_log2 * tanhf(x / cap_log2);
        s[t][g] = off[t] >= 0 ? x : neg_inf();
      }

    // Prefetch: the next step's K rows load while this step's softmax runs.
    if (base + kStride < end) {
      offsets(base + kStride, off);
#pragma unroll
      for (int t = 0; t < kKeysPerSlot; ++t) k_raw[t].load_or_zero(k_cache, off[t]);
    }

    // m' = max(m, max_t s_t);  l' = l 2^(m - m') + sum_t 2^(s_t - m');
    // acc' = acc 2^(m - m') + sum_t 2^(s_t - m') v_t.  (A slot that has seen no
    // key yet has m' = -inf; it subtracts 0 instead, and every weight is 0.)
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float m_new = m[g];
#pragma unroll
      for (int t = 0; t < kKeysPerSlot; ++t) m_new = fmaxf(m_new, s[t][g]);
      const float m_ref = m_new == neg_inf() ? 0.0f : m_new;
      const float correction = exp2f(m[g] - m_ref);
      l[g] *= correction;
#pragma unroll
      for (int i = 0; i < VEC; ++i) acc[g][i] *= correction;
#pragma unroll
      for (int t = 0; t < kKeysPerSlot; ++t) {
        const float w = exp2f(s[t][g] - m_ref);
        l[g] += w;
#pragma unroll
        for (int i = 0; i < VEC; ++i) acc[g][i] += w * v_raw[t][i];
      }
      m[g] = m_new;
    }
  }

  // Merge the slots of each warp (lanes r, r + kLanes, ... hold the same
  // elements): M = max(m_a, m_b), l = l_a 2^(m_a - M) + l_b 2^(m_b - M), likewise acc.
#pragma unroll
  for (int o = kLanes; o < 32; o <<= 1)
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float m_o = __shfl_xor_sync(0xffffffffu, m[g], o);
      const float l_o = __shfl_xor_sync(0xffffffffu, l[g], o);
      const float m_new = fmaxf(m[g], m_o);
      const float m_ref = m_new == neg_inf() ? 0.0f : m_new;
      const float a = exp2f(m[g] - m_ref), c = exp2f(m_o - m_ref);
      l[g] = l[g] * a + l_o * c;
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float acc_o = __shfl_xor_sync(0xffffffffu, acc[g][i], o);
        acc[g][i] = acc[g][i] * a + acc_o * c;
      }
      m[g] = m_new;
    }

  // Merge the warps through shared memory, the same way; a warp that saw no key
  // has m = -inf and weight 2^-inf = 0.
  __shared__ float m_s[kWarps][G], l_s[kWarps][G];
  __shared__ __align__(16) float acc_s[kWarps][G][D];
  if (slot == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (r == 0) {
        m_s[warp][g] = m[g];
        l_s[warp][g] = l[g];
      }
#pragma unroll
      for (int i = 0; i < VEC; ++i) acc_s[warp][g][r * VEC + i] = acc[g][i];
    }
  }
  __syncthreads();  // every warp's (m, l, acc) is in shared memory before anyone merges

  // Thread i owns output elements 4i .. 4i+3 (D is a multiple of 4), then 4i + 512, ...
  for (int i = 4 * threadIdx.x; i < heads * D; i += 4 * kThreads) {
    const int g = i / D, d = i % D;
    float m_max = neg_inf();
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m_max = fmaxf(m_max, m_s[w][g]);
    float l_sum = 0.0f, o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float weight = exp2f(m_s[w][g] - m_max);
      l_sum += l_s[w][g] * weight;
#pragma unroll
      for (int e = 0; e < 4; ++e) o[e] += acc_s[w][g][d + e] * weight;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) o[e] *= v_scale / l_sum;  // v_scale: 1 unless the cache is FP8
    const int h = h0 + g;
    const i64 part = (i64(b) * num_heads + h) * num_partitions + p;
    if (num_partitions == 1) {
      store_floats<T, 4>(out + (i64(row) * num_heads + h) * D + d, o);
    } else {
      store_floats<float, 4>(part_o + part * D + d, o);
      if (d == 0) {
        part_ml[2 * part] = m_max;
        part_ml[2 * part + 1] = l_sum;
      }
    }
  }
}

// Merge a split decode's partitions:
//   M = max_p m_p,   w_p = l_p 2^(m_p - M),   out = sum_p w_p o_p / sum_p w_p
// over the partitions that hold tokens of this sequence (ceil(L' / ps), L' the
// tokens in its window).
// Grid: (H, B). Block: threads stride over D, 4 elements (one float4 of each
// partial) at a time; the weights w_p go through shared memory (dynamic, P floats).
template <typename T>
__device__ void paged_attention_decode_reduce(
    T* __restrict__ out,                      // [T, H, D]
    const float* __restrict__ part_o,         // [B, H, P, D]
    const float* __restrict__ part_ml,        // [B, H, P, 2]
    const int* __restrict__ seq_lens,         // [B]
    const int* __restrict__ query_start_loc,  // [B+1]
    int head_size, int num_partitions, int min_partition, int sliding_window) {
  const int h = blockIdx.x, b = blockIdx.y, num_heads = gridDim.x;
  __shared__ int meta_s[3];  // seq_lens[b], query_start_loc[b], query_start_loc[b + 1]
  if (threadIdx.x < 3)
    meta_s[threadIdx.x] = threadIdx.x == 0 ? seq_lens[b] : query_start_loc[b + threadIdx.x - 1];
  __syncthreads();  // meta_s written before anyone reads it
  const int seq_len = meta_s[0], row = meta_s[1];
  if (meta_s[2] == row) return;  // no new token this step
  const int visible = sliding_window > 0 ? min(seq_len, sliding_window) : seq_len;
  const int ps = decode::partition_tokens(visible, num_partitions, min_partition);
  const int used = ceil_div(visible, ps);
  const i64 first = (i64(b) * num_heads + h) * num_partitions;
  const float* ml = part_ml + 2 * first;
  float* w = dynamic_smem<float>();  // [P]
  __shared__ float m_max;

  if (threadIdx.x < 32) {  // M = max_p m_p, by one warp
    float m = neg_inf();
    for (int p = threadIdx.x; p < used; p += 32) m = fmaxf(m, ml[2 * p]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (threadIdx.x == 0) m_max = m;
  }
  __syncthreads();  // m_max written before anyone weighs a partition
  for (int p = threadIdx.x; p < used; p += blockDim.x)
    w[p] = ml[2 * p + 1] * exp2f(ml[2 * p] - m_max);
  __syncthreads();  // all w_p written before anyone sums them

  float l_sum = 0.0f;
  for (int p = 0; p < used; ++p) l_sum += w[p];
  const float inv_l = 1.0f / l_sum;
  for (int d = 4 * threadIdx.x; d < head_size; d += 4 * blockDim.x) {  // 4 elements a thread
    float o[4] = {0.0f, 0.0f, 0.0f, 0.0f}, o_p[4];
    for (int p = 0; p < used; ++p) {
      load_floats<float, 4>(part_o + (first + p) * head_size + d, o_p);
#pragma unroll
      for (int e = 0; e < 4; ++e) o[e] += w[p] * o_p[e];
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) o[e] *= inv_l;
    store_floats<T, 4>(out + (i64(row) * num_heads + h) * head_size + d, o);
  }
}

// Entry points: paged_attention_decode_<dtype>[_fp8]_d<D>_g<G>; the _fp8 ones
// read an e4m3 cache and take its scales.
#define DECODE_ENTRY(T, C, suffix, D, G, KIND)                               \
  extern "C" __global__ void __launch_bounds__(decode::kThreads, decode::min_blocks<C, D, G>()) \
      paged_attention_decode_##suffix##_d##D##_g##G(                                           \
          T* out, float* part_o, float* part_ml, const T* q, const C* k_cache,                \
          const C* v_cache, const int* block_tables, const int* seq_lens,                     \
          const int* query_start_loc, int max_blocks, int num_heads, int num_kv_heads,        \
          int block_size, int q_stride, float scale, int min_partition, int sliding_window,   \
          float soft_cap SCALES_PARAM_##KIND) {                                                       \
    paged_attention_decode<T, C, D, G>(out, part_o, part_ml, q, k_cache, v_cache,             \
                                       block_tables, seq_lens, query_start_loc, max_blocks,   \
                                       num_heads, num_kv_heads, block_size, q_stride, scale,  \
                                       min_partition, sliding_window, soft_cap, SCALES_ARG_##KIND);      \
  }

// KIND is NONE or FP8; pasted (never expanded as an argument), so that the
// FP8 parameter list can carry its comma.
#define SCALES_PARAM_NONE
#define SCALES_PARAM_FP8 , const float* kv_scales
#define SCALES_ARG_NONE nullptr
#define SCALES_ARG_FP8 kv_scales
#define DECODE_GROUPS(T, C, suffix, D, KIND) \
  DECODE_ENTRY(T, C, suffix, D, 1, KIND)     \
  DECODE_ENTRY(T, C, suffix, D, 2, KIND)     \
  DECODE_ENTRY(T, C, suffix, D, 4, KIND)     \
  DECODE_ENTRY(T, C, suffix, D, 8, KIND)

// RP_ONE_HEAD_SIZE=D instantiates head size D alone, and the launch code always builds
// so (rawpage/ops/paged_attention.py): all 168 kernels take NVRTC over a minute (an H200
// check's steps timed out in that compile) and the simulator's counting build minutes.
#ifdef RP_ONE_HEAD_SIZE
#define DECODE_HEAD_SIZES(T, C, suffix, KIND) DECODE_GROUPS(T, C, suffix, RP_ONE_HEAD_SIZE, KIND)
#else
#define DECODE_HEAD_SIZES(T, C, suffix, KIND) \
  DECODE_GROUPS(T, C, suffix, 16, KIND)       \
  DECODE_GROUPS(T, C, suffix, 32, KIND)       \
  DECODE_GROUPS(T, C, suffix, 64, KIND)       \
  DECODE_GROUPS(T, C, suffix, 80, KIND)       \
  DECODE_GROUPS(T, C, suffix, 96, KIND)       \
  DECODE_GROUPS(T, C, suffix, 128, KIND)      \
  DECODE_GROUPS(T, C, suffix, 256, KIND)
#endif

#define DECODE_ENTRIES(T, suffix)                                                              \
  DECODE_HEAD_SIZES(T, T, suffix, NONE)                                    \
  DECODE_HEAD_SIZES(T, fp8_e4m3, suffix##_fp8, FP8)                    \
  extern "C" __global__ void paged_attention_decode_reduce_##suffix(                          \
      T* out, const float* part_o, const float* part_ml, const int* seq_lens,                 \
      const int* query_start_loc, int head_size, int num_partitions, int min_partition,       \
      int sliding_window) {                                                                    \
    paged_attention_decode_reduce<T>(out, part_o, part_ml, seq_lens, query_start_loc,         \
                                     head_size, num_partitions, min_partition, sliding_window); \
  }

DECODE_ENTRIES(float, f32)
DECODE_ENTRIES(__half, f16)
DECODE_ENTRIES(__nv_bfloat16, bf16)
