// Scatter this step's new K and V rows into the paged KV cache.
//
//   k_cache[slot] = k[t],  v_cache[slot] = v[t]   where slot = slot_mapping[t] >= 0
//
// slot = block * BS + offset, so with the cache viewed as [NB * BS, Hkv, D]
// a slot is a row index. slot -1 marks a padding token: nothing is stored.
//
// In the forward pass: after rope, before paged_attention reads the cache.
//
// A row (Hkv * D elements) moves as 16-byte chunks, so one kernel serves every
// dtype. Grid: one block per token. Block: threads stride over the row's chunks.
#include "common.cuh"

using namespace rawpage;

extern "C" __global__ void write_kv(
    const uint4* __restrict__ k,           // [T, Hkv, D] as 16-byte chunks, token stride k_stride
    const uint4* __restrict__ v,           // [T, Hkv, D] as 16-byte chunks, token stride v_stride
    uint4* __restrict__ k_cache,           // [NB, BS, Hkv, D] as 16-byte chunks
    uint4* __restrict__ v_cache,           // [NB, BS, Hkv, D] as 16-byte chunks
    const int* __restrict__ slot_mapping,  // [T]
    int row_chunks,                        // Hkv * D * sizeof(T) / 16
    int k_stride, int v_stride) {
  const int t = blockIdx.x;
  const int slot = slot_mapping[t];
  if (slot < 0) return;
  const i64 dst = i64(slot) * row_chunks;
  for (int c = threadIdx.x; c < row_chunks; c += blockDim.x) {
    k_cache[dst + c] = k[i64(t) * k_stride + c];
    v_cache[dst + c] = v[i64(t) * v_stride + c];
  }
}
