// Rotary position embedding, applied to q and k in place.
//
// For a head vector x at position p, pairs of lanes (a, b) rotate by the angle
// p * inv_freq[j], with cos/sin read from the precomputed cache:
//   a' = a cos - b sin,   b' = b cos + a sin
// NeoX style pairs lane j with lane j + D/2 (Hugging Face Llama); GPT-J style
// pairs lanes 2j and 2j + 1 (llama.cpp's layout).
//
// In the forward pass: right after the qkv projection, before write_kv stores k.
// q and k are usually views into the fused qkv output, hence the token strides.
//
// Grid: one block per token. Block: threads stride over that token's
// (H + Hkv) * D/2 rotation pairs.
#include "common.cuh"

using namespace rawpage;

template <typename T>
__device__ void rope(const int* __restrict__ positions,  // [T]
                     T* __restrict__ q,                  // [T, H, D], token stride q_stride
                     T* __restrict__ k,                  // [T, Hkv, D], token stride k_stride
                     const float* __restrict__ cos_sin,  // [max_pos, D]: row p is [cos | sin]
                     int head_size, int num_heads, int num_kv_heads, int q_stride, int k_stride,
                     int is_neox) {
  const int t = blockIdx.x;
  const int half = head_size / 2;
  const float* cos = cos_sin + i64(positions[t]) * head_size;
  const float* sin = cos + half;
  const int pairs = (num_heads + num_kv_heads) * half;
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    const int head = i / half, j = i % half;
    T* x = head < num_heads ? q + i64(t) * q_stride + head * head_size
                            : k + i64(t) * k_stride + (head - num_heads) * head_size;
    const int ia = is_neox ? j : 2 * j;
    const int ib = is_neox ? j + half : 2 * j + 1;
    const float a = to_float(x[ia]), b = to_float(x[ib]);
    x[ia] = from_float<T>(a * cos[j] - b * sin[j]);
    x[ib] = from_float<T>(b * cos[j] + a * sin[j]);
  }
}

#define ROPE_ENTRY(T, suffix)                                                                  \
  extern "C" __global__ void rope_##suffix(const int* positions, T* q, T* k,                   \
                                           const float* cos_sin, int head_size, int num_heads, \
                                           int num_kv_heads, int q_stride, int k_stride,       \
                                           int is_neox) {                                      \
    rope<T>(positions, q, k, cos_sin, head_size, num_heads, num_kv_heads, q_stride, k_stride,  \
            is_neox);                                                                          \
  }

ROPE_ENTRY(float, f32)
ROPE_ENTRY(__half, f16)
ROPE_ENTRY(__nv_bfloat16, bf16)
