// Paged attention for decode: one new query token per sequence, against the
// keys and values of its whole context, which live in blocks of the paged cache.
//
//   s_j = (q . k_j) * scale           for the context's tokens j = 0 .. L-1
//   o   = sum_j softmax(s)_j v_j
//
// Token j of sequence b sits in physical block block_tables[b, j / BS], at
// offset j % BS. With GQA, query head h reads KV head h / (H / Hkv).
//
// Long contexts are split into partitions of `partition_size` tokens
// (flash-decoding). Each block reduces its partition to (m, l, o): the maximum
// score, the softmax denominator relative to it, and the normalized output.
// paged_attention_decode_reduce then merges the partitions:
//   M = max_p m_p,   w_p = l_p 2^(m_p - M),   o = sum_p w_p o_p / sum_p w_p
// With one partition the first kernel writes the output itself.
//
// Scores are kept in log2 units (s * log2(e)) so that every exponential is one
// exp2f.
//
// In the forward pass: after write_kv, when every sequence in the batch decodes
// (a batch with any prefill goes to paged_attention_prefill.cu).
//
// Grid: (H, B, P): one block per query head, sequence and partition.
// Block: 128 threads = 8 slots of 16 lanes. A slot takes one key at a time and
// each of its lanes holds D/16 consecutive elements of q, k, v and the output,
// so a slot reads a key's head vector as one contiguous run. The two slots of a
// warp take adjacent keys.
#include "common.cuh"

using namespace rawpage;

namespace decode {
constexpr int kThreads = 128;
constexpr int kSlotLanes = 16;                 // lanes sharing one key
constexpr int kSlots = kThreads / kSlotLanes;  // keys in flight per block
constexpr int kSlotsPerWarp = 32 / kSlotLanes;
constexpr float kLog2e = 1.4426950408889634f;
}  // namespace decode

template <typename T, int D>
__device__ void paged_attention_decode(
    T* __restrict__ out,                      // [T, H, D], written when P == 1
    float* __restrict__ part_o,               // [B, H, P, D] normalized partition outputs (P > 1)
    float* __restrict__ part_ml,              // [B, H, P, 2] partition (max, sum), log2 units (P > 1)
    const T* __restrict__ q,                  // [T, H, D], token stride q_stride
    const T* __restrict__ k_cache,            // [NB, BS, Hkv, D]
    const T* __restrict__ v_cache,            // [NB, BS, Hkv, D]
    const int* __restrict__ block_tables,     // [B, max_blocks]
    const int* __restrict__ seq_lens,         // [B], context length including the new token
    const int* __restrict__ query_start_loc,  // [B+1]: sequence b's query is row query_start_loc[b]
    int max_blocks, int num_kv_heads, int block_size, int partition_size, int q_stride,
    float scale) {
  using namespace decode;
  constexpr int VEC = D / kSlotLanes;
  const int h = blockIdx.x, b = blockIdx.y, p = blockIdx.z;
  const int num_heads = gridDim.x, num_partitions = gridDim.z;
  const int seq_len = seq_lens[b];
  const int start = p * partition_size;
  if (start >= seq_len) return;  // past this sequence's end: the reduce never reads it
  if (query_start_loc[b + 1] == query_start_loc[b]) return;  // no new token this step
  const int end = min(start + partition_size, seq_len);
  const int kv_head = h / (num_heads / num_kv_heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int slot = threadIdx.x / kSlotLanes, r = threadIdx.x % kSlotLanes;
  const int row = query_start_loc[b];

  // q_r = this lane's D/16 elements of q, times scale * log2(e)
  float q_r[VEC];
  load_floats<T, VEC>(q + i64(row) * q_stride + h * D + r * VEC, q_r);
#pragma unroll
  for (int i = 0; i < VEC; ++i) q_r[i] *= scale * kLog2e;

  // Online softmax over this slot's keys: running max m, denominator l, and
  // unnormalized output acc, all relative to m.
  float m = neg_inf(), l = 0.0f, acc[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) acc[i] = 0.0f;

  // The loop bound is the same for both slots of a warp, so the shuffles below
  // always have all 32 lanes; a slot past `end` computes nothing.
  for (int base = start + warp * kSlotsPerWarp; base < end; base += kSlots) {
    const int j = base + lane / kSlotLanes;
    const bool valid = j < end;
    float k_r[VEC], v_r[VEC], s = 0.0f;
    if (valid) {
      const int physical = block_tables[i64(b) * max_blocks + j / block_size];
      const i64 offset =
          ((i64(physical) * block_size + j % block_size) * num_kv_heads + kv_head) * D + r * VEC;
      load_floats<T, VEC>(k_cache + offset, k_r);
      load_floats<T, VEC>(v_cache + offset, v_r);
#pragma unroll
      for (int i = 0; i < VEC; ++i) s += q_r[i] * k_r[i];
    }
    // s_j = q . k_j: sum the slot's 16 partial dot products
#pragma unroll
    for (int o = kSlotLanes / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (valid) {
      // m' = max(m, s_j);  l' = l 2^(m - m') + 2^(s_j - m');  acc' = acc 2^(m - m') + 2^(s_j - m') v_j
      const float m_new = fmaxf(m, s);
      const float correction = exp2f(m - m_new), weight = exp2f(s - m_new);
      l = l * correction + weight;
#pragma unroll
      for (int i = 0; i < VEC; ++i) acc[i] = acc[i] * correction + weight * v_r[i];
      m = m_new;
    }
  }

  // Merge the slots: M = max_s m_s,  L = sum_s l_s 2^(m_s - M),  o = sum_s acc_s 2^(m_s - M) / L.
  // A slot that saw no key has m = -inf and contributes 2^-inf = 0.
  __shared__ float slot_m[kSlots], slot_l[kSlots];
  __shared__ float slot_acc[kSlots][D];
  if (r == 0) {
    slot_m[slot] = m;
    slot_l[slot] = l;
  }
#pragma unroll
  for (int i = 0; i < VEC; ++i) slot_acc[slot][r * VEC + i] = acc[i];
  __syncthreads();  // every slot's (m, l, acc) is in shared memory before anyone merges

  float m_max = neg_inf();
#pragma unroll
  for (int s = 0; s < kSlots; ++s) m_max = fmaxf(m_max, slot_m[s]);
  float w[kSlots], l_sum = 0.0f;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    w[s] = exp2f(slot_m[s] - m_max);
    l_sum += slot_l[s] * w[s];
  }
  const float inv_l = 1.0f / l_sum;
  const i64 part = (i64(b) * num_heads + h) * num_partitions + p;
  for (int d = threadIdx.x; d < D; d += kThreads) {
    float o = 0.0f;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) o += slot_acc[s][d] * w[s];
    if (num_partitions == 1)
      out[(i64(row) * num_heads + h) * D + d] = from_float<T>(o * inv_l);
    else
      part_o[part * D + d] = o * inv_l;
  }
  if (num_partitions > 1 && threadIdx.x == 0) {
    part_ml[2 * part] = m_max;
    part_ml[2 * part + 1] = l_sum;
  }
}

// Merge a split decode's partitions:
//   M = max_p m_p,   w_p = l_p 2^(m_p - M),   out = sum_p w_p o_p / sum_p w_p
// over the partitions that hold tokens of this sequence (ceil(L / partition_size)).
// Grid: (H, B). Block: threads stride over D; the weights w_p go through shared
// memory (dynamic, P floats).
template <typename T>
__device__ void paged_attention_decode_reduce(
    T* __restrict__ out,                      // [T, H, D]
    const float* __restrict__ part_o,         // [B, H, P, D]
    const float* __restrict__ part_ml,        // [B, H, P, 2]
    const int* __restrict__ seq_lens,         // [B]
    const int* __restrict__ query_start_loc,  // [B+1]
    int head_size, int partition_size, int num_partitions) {
  const int h = blockIdx.x, b = blockIdx.y, num_heads = gridDim.x;
  if (query_start_loc[b + 1] == query_start_loc[b]) return;  // no new token this step
  const int used = ceil_div(seq_lens[b], partition_size);
  const i64 first = (i64(b) * num_heads + h) * num_partitions;
  const float* ml = part_ml + 2 * first;
  float* w = dynamic_smem<float>();  // [P]

  float m_max = neg_inf();
  for (int p = 0; p < used; ++p) m_max = fmaxf(m_max, ml[2 * p]);
  for (int p = threadIdx.x; p < used; p += blockDim.x) w[p] = ml[2 * p + 1] * exp2f(ml[2 * p] - m_max);
  __syncthreads();  // all w_p written before anyone sums them

  float l_sum = 0.0f;
  for (int p = 0; p < used; ++p) l_sum += w[p];
  const float inv_l = 1.0f / l_sum;
  const int row = query_start_loc[b];
  for (int d = threadIdx.x; d < head_size; d += blockDim.x) {
    float o = 0.0f;
    for (int p = 0; p < used; ++p) o += w[p] * part_o[(first + p) * head_size + d];
    out[(i64(row) * num_heads + h) * head_size + d] = from_float<T>(o * inv_l);
  }
}

#define DECODE_ENTRY(T, suffix, D)                                                             \
  extern "C" __global__ void __launch_bounds__(decode::kThreads)                              \
      paged_attention_decode_##suffix##_d##D(                                                  \
          T* out, float* part_o, float* part_ml, const T* q, const T* k_cache,                \
          const T* v_cache, const int* block_tables, const int* seq_lens,                     \
          const int* query_start_loc, int max_blocks, int num_kv_heads, int block_size,       \
          int partition_size, int q_stride, float scale) {                                    \
    paged_attention_decode<T, D>(out, part_o, part_ml, q, k_cache, v_cache, block_tables,     \
                                 seq_lens, query_start_loc, max_blocks, num_kv_heads,         \
                                 block_size, partition_size, q_stride, scale);                \
  }

#define DECODE_ENTRIES(T, suffix)                                                              \
  DECODE_ENTRY(T, suffix, 16)                                                                  \
  DECODE_ENTRY(T, suffix, 32)                                                                  \
  DECODE_ENTRY(T, suffix, 64)                                                                  \
  DECODE_ENTRY(T, suffix, 80)                                                                  \
  DECODE_ENTRY(T, suffix, 96)                                                                  \
  DECODE_ENTRY(T, suffix, 128)                                                                 \
  DECODE_ENTRY(T, suffix, 256)                                                                 \
  extern "C" __global__ void paged_attention_decode_reduce_##suffix(                          \
      T* out, const float* part_o, const float* part_ml, const int* seq_lens,                 \
      const int* query_start_loc, int head_size, int partition_size, int num_partitions) {    \
    paged_attention_decode_reduce<T>(out, part_o, part_ml, seq_lens, query_start_loc,         \
                                     head_size, partition_size, num_partitions);              \
  }

DECODE_ENTRIES(float, f32)
DECODE_ENTRIES(__half, f16)
DECODE_ENTRIES(__nv_bfloat16, bf16)
