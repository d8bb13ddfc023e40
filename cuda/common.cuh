// Device helpers every kernel file shares: dtype conversion, vectorized loads,
// warp and block reductions, and the dynamic shared memory array.
//
// Kernel files include only <cuda_fp16.h>, <cuda_bf16.h>, <mma.h> and this
// header, so that NVRTC (CuPy's RawModule) compiles them without a host
// standard library, and so does the simulator's g++ build.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "mma.cuh"  // the tensor-core PTX wrappers (mma.sync, ldmatrix, cp.async)

namespace rawpage {

using i64 = long long;  // for offsets into the KV cache, which can pass 2^31 elements

// ---- dtypes: every kernel computes in float and stores in T ------------------------
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

template <typename A, typename B>
struct is_same {
  static constexpr bool value = false;
};
template <typename A>
struct is_same<A, A> {
  static constexpr bool value = true;
};

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// ---- vectorized loads: N elements of T at p, in the widest aligned chunks -----------
// A 16-byte load is one instruction and one memory transaction per lane; callers
// keep p aligned to the chunk (the launch code checks base pointers and strides).
template <int BYTES>
struct Chunk;
template <>
struct Chunk<16> {
  using type = uint4;
};
template <>
struct Chunk<8> {
  using type = uint2;
};
template <>
struct Chunk<4> {
  using type = unsigned int;
};
template <>
struct Chunk<2> {
  using type = unsigned short;
};

template <typename T, int N>
struct VecIO {
  static constexpr int kBytes = N * int(sizeof(T));
  static constexpr int kChunk = kBytes % 16 == 0 ? 16 : kBytes % 8 == 0 ? 8 : kBytes % 4 == 0 ? 4 : 2;
  static constexpr int kPer = kChunk / int(sizeof(T));
  using C = typename Chunk<kChunk>::type;
};

template <typename T, int N>
__device__ __forceinline__ void load_floats(const T* __restrict__ p, float* out) {
  using IO = VecIO<T, N>;
#pragma unroll
  for (int c = 0; c < N / IO::kPer; ++c) {
    const typename IO::C v = reinterpret_cast<const typename IO::C*>(p)[c];
    const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int i = 0; i < IO::kPer; ++i) out[c * IO::kPer + i] = to_float(e[i]);
  }
}

// ---- vectorized stores: N floats to N elements of T at p, widest aligned chunks ------
template <typename T, int N>
__device__ __forceinline__ void store_floats(T* __restrict__ p, const float* in) {
  using IO = VecIO<T, N>;
#pragma unroll
  for (int c = 0; c < N / IO::kPer; ++c) {
    typename IO::C v;
    T* e = reinterpret_cast<T*>(&v);
#pragma unroll
    for (int i = 0; i < IO::kPer; ++i) e[i] = from_float<T>(in[c * IO::kPer + i]);
    reinterpret_cast<typename IO::C*>(p)[c] = v;
  }
}

// ---- reductions ----------------------------------------------------------------------
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Sum over the block; every thread gets the result. blockDim.x must be a multiple of 32.
__device__ __forceinline__ float block_sum(float x) {
  __shared__ float warp_partials[32];
  __shared__ float total;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  x = warp_sum(x);
  if (lane == 0) warp_partials[warp] = x;
  __syncthreads();  // warp_partials complete before warp 0 reads them
  if (warp == 0) {
    x = lane < int(blockDim.x / 32) ? warp_partials[lane] : 0.0f;
    x = warp_sum(x);
    if (lane == 0) total = x;
  }
  __syncthreads();  // total written before anyone reads it
  return total;
}

__device__ __forceinline__ int warp_max(int x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x = max(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// max(values[0 .. n-1]) (-1 if n is 0), read once by warp 0 and shared with the block;
// every thread gets the result, so every thread must call it.
__device__ __forceinline__ int block_max_of(const int* __restrict__ values, int n) {
  __shared__ int result;
  if (threadIdx.x < 32) {
    int x = -1;
    for (int i = threadIdx.x; i < n; i += 32) x = max(x, values[i]);
    x = warp_max(x);
    if (threadIdx.x == 0) result = x;
  }
  __syncthreads();  // result written before anyone reads it
  return result;
}

}  // namespace rawpage

// The launch's dynamic shared memory (shared_mem= bytes), viewed as T. At global
// scope, because a block-scope extern declaration names a member of the
// enclosing namespace, and the simulator defines this array globally.
template <typename T>
__device__ __forceinline__ T* dynamic_smem() {
  extern __shared__ __align__(128) unsigned char rawpage_dynamic_smem[];
  return reinterpret_cast<T*>(rawpage_dynamic_smem);
}
