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
// Grid: flat over (token, head group, chunk), 128 threads a block. A thread
// takes one chunk of V elements of a head vector (V = 16 bytes of T): NeoX,
// lanes j0 .. j0+V-1 and their partners j0+D/2 ..; GPT-J, lanes 2 j0 .. 2 j0+V-1,
// i.e. V/2 pairs. It reads the chunk's cos and sin once and applies them to the
// same chunk of kHeadGroup heads (q's, then k's), so the float32 cos/sin rows
// are read (H + Hkv) / 8 times per token rather than once per head.
// Rows that are not 16-byte aligned go two elements at a time (VECTOR = false).
#include "common.cuh"

using namespace rawpage;

namespace rope_detail {
constexpr int kHeadGroup = 8;

// N elements of T at p as floats, and back: vectors, or one element at a time.
template <typename T, int N, bool VECTOR>
__device__ __forceinline__ void load(const T* p, float* out) {
  if (VECTOR) {
    load_floats<T, N>(p, out);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_float(p[i]);
  }
}
template <typename T, int N, bool VECTOR>
__device__ __forceinline__ void store(T* p, const float* in) {
  if (VECTOR) {
    store_floats<T, N>(p, in);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = from_float<T>(in[i]);
  }
}
}  // namespace rope_detail

template <typename T, bool NEOX, bool VECTOR>
__device__ void rope(const int* __restrict__ positions,  // [T]
                     T* __restrict__ q,                  // [T, H, D], token stride q_stride
                     T* __restrict__ k,                  // [T, Hkv, D], token stride k_stride
                     const float* __restrict__ cos_sin,  // [max_pos, D]: row p is [cos | sin]
                     int head_size, int num_heads, int num_kv_heads, int q_stride, int k_stride,
                     int num_tokens) {
  using namespace rope_detail;
  constexpr int V = VECTOR ? 16 / int(sizeof(T)) : 2;  // elements of x per thread and head
  constexpr int kPairs = NEOX ? V : V / 2;              // rotation pairs among them
  const int half = head_size / 2;
  const int chunks = half / kPairs;
  const int heads = num_heads + num_kv_heads, groups = ceil_div(heads, kHeadGroup);
  const i64 id = i64(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= i64(num_tokens) * groups * chunks) return;
  const int c = int(id % chunks), group = int(id / chunks % groups), t = int(id / chunks / groups);
  const int j0 = c * kPairs;  // this thread's first pair

  // cos_j, sin_j for j = j0 .. j0 + kPairs - 1, read once for the whole head group
  float cos_j[kPairs], sin_j[kPairs];
  const float* row = cos_sin + i64(positions[t]) * head_size;
  load<float, kPairs, VECTOR>(row + j0, cos_j);
  load<float, kPairs, VECTOR>(row + half + j0, sin_j);

  const int h_end = min(heads, (group + 1) * kHeadGroup);
#pragma unroll 4
  for (int h = group * kHeadGroup; h < h_end; ++h) {
    T* x = h < num_heads ? q + i64(t) * q_stride + h * head_size
                         : k + i64(t) * k_stride + (h - num_heads) * head_size;
    if (NEOX) {
      // a = x[j], b = x[j + D/2]:  a' = a cos - b sin,  b' = b cos + a sin
      float a[V], b[V];
      load<T, V, VECTOR>(x + j0, a);
      load<T, V, VECTOR>(x + half + j0, b);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float ai = a[i];
        a[i] = ai * cos_j[i % kPairs] - b[i] * sin_j[i % kPairs];
        b[i] = b[i] * cos_j[i % kPairs] + ai * sin_j[i % kPairs];
      }
      store<T, V, VECTOR>(x + j0, a);
      store<T, V, VECTOR>(x + half + j0, b);
    } else {
      // a = x[2j], b = x[2j + 1]
      float e[V];
      load<T, V, VECTOR>(x + 2 * j0, e);
#pragma unroll
      for (int i = 0; i < kPairs; ++i) {
        const float a = e[2 * i], b = e[2 * i + 1];
        e[2 * i] = a * cos_j[i] - b * sin_j[i];
        e[2 * i + 1] = b * cos_j[i] + a * sin_j[i];
      }
      store<T, V, VECTOR>(x + 2 * j0, e);
    }
  }
}

#define ROPE_ENTRY(T, suffix, NEOX, style, VECTOR, vec)                                        \
  extern "C" __global__ void rope_##suffix##_##style##vec(                                     \
      const int* positions, T* q, T* k, const float* cos_sin, int head_size, int num_heads,    \
      int num_kv_heads, int q_stride, int k_stride, int num_tokens) {                          \
    rope<T, NEOX, VECTOR>(positions, q, k, cos_sin, head_size, num_heads, num_kv_heads,        \
                          q_stride, k_stride, num_tokens);                                     \
  }

#define ROPE_ENTRIES(T, suffix)                      \
  ROPE_ENTRY(T, suffix, true, neox, true, )          \
  ROPE_ENTRY(T, suffix, true, neox, false, _scalar)  \
  ROPE_ENTRY(T, suffix, false, gptj, true, )         \
  ROPE_ENTRY(T, suffix, false, gptj, false, _scalar)

ROPE_ENTRIES(float, f32)
ROPE_ENTRIES(__half, f16)
ROPE_ENTRIES(__nv_bfloat16, bf16)
