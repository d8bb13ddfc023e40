// Whole-block copies inside one layer's KV cache, for copy-on-write: when a
// forked sequence appends to a block it shares, the block manager gives it a
// fresh block and asks for the old one's contents to be copied there.
//
//   k_cache[dst] = k_cache[src],  v_cache[dst] = v_cache[src]   for each (src, dst)
//
// No dst may also be a src in the same call (the block manager never asks for that).
// Blocks move as 16-byte chunks, so one kernel serves every dtype.
//
// Grid: (N pairs, 2): blockIdx.y picks K or V. Block: threads stride over the
// block's chunks.
#include "common.cuh"

using namespace rawpage;

extern "C" __global__ void copy_blocks(
    uint4* __restrict__ k_cache,            // [NB, BS, Hkv, D] as 16-byte chunks
    uint4* __restrict__ v_cache,            // [NB, BS, Hkv, D] as 16-byte chunks
    const int* __restrict__ block_mapping,  // [N, 2]: (src, dst)
    int block_chunks) {                     // BS * Hkv * D * sizeof(T) / 16
  uint4* cache = blockIdx.y == 0 ? k_cache : v_cache;
  const i64 src = i64(block_mapping[2 * blockIdx.x]) * block_chunks;
  const i64 dst = i64(block_mapping[2 * blockIdx.x + 1]) * block_chunks;
  for (int c = threadIdx.x; c < block_chunks; c += blockDim.x) cache[dst + c] = cache[src + c];
}
