// Batched LoRA, Punica's SGMV idea: every sequence of the batch may run with its
// own adapter, and one launch serves them all. For a Linear layer y = x·Wᵀ,
//
//   shrink:  v[t, :] = x[t, :] · A[s]ᵀ          A: [S, R, in]   v: [T, R] float32
//   expand:  y[t, :] += v[t, :] · B[s]          B: [S, R, out]  (scale folded into B)
//
// for every token t of segment b (the tokens query_start_loc[b] .. [b+1] of one
// sequence), with s = seg_slots[b] its adapter's slot; s = -1 means no adapter and
// the segment is skipped (its v rows are never read). A fused q/k/v or gate/up
// layer stacks its parts' ranks along R, and B is block-diagonal, so one launch
// still serves it.
//
// Segments are the batch's sequences, so the launch depends only on B, never on
// which adapters are in the batch: a decode CUDA graph captured once reads new
// seg_slots at each replay.
#include "common.cuh"

using namespace rawpage;

// shrink. Grid: (B segments, ceil(R / WARPS)). Block: WARPS warps; warp w of block
// (b, y) computes rank row r = y * WARPS + w for every token of segment b: its 32
// lanes stride over `in` in chunks of VEC elements, then reduce with warp_sum.
template <typename T, int VEC, int WARPS>
__device__ void lora_shrink(float* __restrict__ v,                  // [T, R]
                            const T* __restrict__ x,                // [T, in]
                            const T* __restrict__ a,                // [S, R, in]
                            const int* __restrict__ seg_starts,     // [B + 1]
                            const int* __restrict__ seg_slots,      // [B]
                            int in, int rank) {                     // in, R
  const int b = blockIdx.x, slot = seg_slots[b];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = blockIdx.y * WARPS + warp;
  if (slot < 0 || r >= rank) return;
  const T* row = a + (i64(slot) * rank + r) * in;  // A[s, r, :]
  for (int t = seg_starts[b]; t < seg_starts[b + 1]; ++t) {
    const T* xt = x + i64(t) * in;
    float acc = 0.0f;
    for (int k = lane * VEC; k < in; k += 32 * VEC) {
      float xv[VEC], av[VEC];
      load_floats<T, VEC>(xt + k, xv);
      load_floats<T, VEC>(row + k, av);
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc += xv[e] * av[e];
    }
    acc = warp_sum(acc);
    if (lane == 0) v[i64(t) * rank + r] = acc;
  }
}

// expand. Grid: (B segments, ceil(out / 256)). Block: 256 threads; thread o of
// block (b, y) owns output column y * 256 + o for every token of segment b: it adds
// v[t, :] · B[s, :, o] to y[t, o]. Threads of a warp read consecutive columns of
// B (coalesced) and the same v[t, r] (a broadcast).
template <typename T>
__device__ void lora_expand(T* __restrict__ y,                  // [T, out], updated in place
                            const float* __restrict__ v,        // [T, R]
                            const T* __restrict__ bm,           // [S, R, out]
                            const int* __restrict__ seg_starts, // [B + 1]
                            const int* __restrict__ seg_slots,  // [B]
                            int out, int rank) {                // out, R
  const int b = blockIdx.x, slot = seg_slots[b];
  const int o = blockIdx.y * blockDim.x + threadIdx.x;
  if (slot < 0 || o >= out) return;
  const T* col = bm + i64(slot) * rank * out + o;  // B[s, 0, o]; rank r is r * out further
  for (int t = seg_starts[b]; t < seg_starts[b + 1]; ++t) {
    const float* vt = v + i64(t) * rank;
    float acc = 0.0f;
    for (int r = 0; r < rank; ++r) acc += vt[r] * to_float(col[i64(r) * out]);
    T* yt = y + i64(t) * out + o;
    *yt = from_float<T>(to_float(*yt) + acc);
  }
}

#define LORA_SHRINK_ENTRY(T, suffix, VEC)                                                         \
  extern "C" __global__ void lora_shrink_##suffix##_v##VEC(float* v, const T* x, const T* a,      \
                                                            const int* seg_starts,                \
                                                            const int* seg_slots, int in,         \
                                                            int rank) {                           \
    lora_shrink<T, VEC, 4>(v, x, a, seg_starts, seg_slots, in, rank);                             \
  }

#define LORA_EXPAND_ENTRY(T, suffix)                                                              \
  extern "C" __global__ void lora_expand_##suffix(T* y, const float* v, const T* bm,              \
                                                   const int* seg_starts, const int* seg_slots,   \
                                                   int out, int rank) {                           \
    lora_expand<T>(y, v, bm, seg_starts, seg_slots, out, rank);                                   \
  }

LORA_SHRINK_ENTRY(float, f32, 4)
LORA_SHRINK_ENTRY(float, f32, 1)
LORA_SHRINK_ENTRY(__half, f16, 8)
LORA_SHRINK_ENTRY(__half, f16, 1)
LORA_SHRINK_ENTRY(__nv_bfloat16, bf16, 8)
LORA_SHRINK_ENTRY(__nv_bfloat16, bf16, 1)
LORA_EXPAND_ENTRY(float, f32)
LORA_EXPAND_ENTRY(__half, f16)
LORA_EXPAND_ENTRY(__nv_bfloat16, bf16)
