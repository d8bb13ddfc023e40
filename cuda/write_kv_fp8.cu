// write_kv for an FP8 KV cache (--kv-cache-dtype fp8): scatter this step's new
// K and V rows into the paged cache, converting each element to e4m3 on store.
//
//   k_cache[slot] = e4m3(k[t] / k_scale),  v_cache[slot] = e4m3(v[t] / v_scale)
//   where slot = slot_mapping[t] >= 0 (-1: a padding token, nothing is stored)
//
// The scales are per tensor (one for K, one for V, all layers share the pair in
// this version) and live on the device, so a captured CUDA graph reads the
// current values. The attention kernels multiply them back on load (fp32 math).
//
// Grid: one block per token. Block: threads stride over the row's Hkv * D
// elements, 8 at a time (one 8-byte store of e4m3 codes per thread and step).
#include "common.cuh"
#include "fp8.cuh"

using namespace rawpage;

template <typename T>
__device__ void write_kv_fp8(const T* __restrict__ k,            // [T, Hkv, D], token stride k_stride
                             const T* __restrict__ v,            // [T, Hkv, D], token stride v_stride
                             uint2* __restrict__ k_cache,        // [NB, BS, Hkv, D] e4m3, as 8-byte groups
                             uint2* __restrict__ v_cache,        // [NB, BS, Hkv, D] e4m3, as 8-byte groups
                             const int* __restrict__ slot_mapping,  // [T]
                             const float* __restrict__ kv_scales,   // [2]: k_scale, v_scale
                             int row,                               // Hkv * D, a multiple of 8
                             int k_stride, int v_stride) {
  const int t = blockIdx.x;
  const int slot = slot_mapping[t];
  if (slot < 0) return;
  const float inv_k = 1.0f / kv_scales[0], inv_v = 1.0f / kv_scales[1];
  for (int c = threadIdx.x; c < row / 8; c += blockDim.x) {
    float kf[8], vf[8];
    load_floats<T, 8>(k + i64(t) * k_stride + 8 * c, kf);
    load_floats<T, 8>(v + i64(t) * v_stride + 8 * c, vf);
    unsigned kw[2] = {0, 0}, vw[2] = {0, 0};  // 8 codes, little-endian: element i in byte i
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      kw[i / 4] |= unsigned(float_to_e4m3(kf[i] * inv_k)) << (8 * (i % 4));
      vw[i / 4] |= unsigned(float_to_e4m3(vf[i] * inv_v)) << (8 * (i % 4));
    }
    uint2 kq, vq;
    kq.x = kw[0], kq.y = kw[1], vq.x = vw[0], vq.y = vw[1];
    k_cache[i64(slot) * (row / 8) + c] = kq;
    v_cache[i64(slot) * (row / 8) + c] = vq;
  }
}

#define WRITE_KV_FP8_ENTRY(T, suffix)                                                                  \
  extern "C" __global__ void write_kv_fp8_##suffix(const T* k, const T* v, uint2* k_cache,             \
                                                   uint2* v_cache, const int* slot_mapping,            \
                                                   const float* kv_scales, int row, int k_stride,      \
                                                   int v_stride) {                                     \
    write_kv_fp8<T>(k, v, k_cache, v_cache, slot_mapping, kv_scales, row, k_stride, v_stride);        \
  }

WRITE_KV_FP8_ENTRY(float, f32)
WRITE_KV_FP8_ENTRY(__half, f16)
WRITE_KV_FP8_ENTRY(__nv_bfloat16, bf16)
