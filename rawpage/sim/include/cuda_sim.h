// cuda_sim.h: what a CUDA kernel source needs in order to compile with g++ and
// run on the CPU under the rawpage simulator. The build includes it before the
// kernel file; <cuda_fp16.h>, <cuda_bf16.h> and <mma.h> resolve to the
// simulator's versions beside this file.
//
// Every CUDA thread is a fiber (see rp_sim_abi.h), so the built-in variables
// below are read from the fiber that is running, and __syncthreads() and the
// warp intrinsics are cooperative barriers implemented by the runtime.
#pragma once

#define RAWPAGE_SIM 1

// ---- declaration specifiers ----------------------------------------------------
#define __device__
#define __host__
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __grid_constant__
#define __constant__ static

#ifdef RP_SIM_DISCOVER
// The build's first pass only preprocesses, to find the entry points and the
// extern __shared__ array; these markers survive preprocessing.
#define __global__ __rp_global__
#define __shared__ __rp_shared__
#define __align__(n)
#define __forceinline__ inline
#else

#include <math.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "rp_sim_abi.h"

#define __global__
#define __forceinline__ inline __attribute__((always_inline))
// Shared memory is per block; a block runs on one worker OS thread at a time,
// so a thread_local (static at block scope) is exactly one copy per block.
// `extern __shared__ T name[]` becomes a block-scope extern declaration of a
// thread_local array that the generated wrapper defines.
#define __shared__ thread_local
#define __align__(n) __attribute__((aligned(n)))

// ---- built-in variables --------------------------------------------------------
#define threadIdx (::rp_sim::self()->thread_idx)
#define blockIdx (::rp_sim::self()->block->block_idx)
#define blockDim (::rp_sim::self()->block->block_dim)
#define gridDim (::rp_sim::self()->block->grid_dim)
constexpr int warpSize = 32;

// ---- vector types ----------------------------------------------------------------
#define RP_SIM_VEC2(T, name, al)               \
  struct __attribute__((aligned(al))) name {   \
    T x, y;                                    \
  };                                           \
  inline name make_##name(T x, T y) { return name{x, y}; }
#define RP_SIM_VEC4(T, name, al)               \
  struct __attribute__((aligned(al))) name {   \
    T x, y, z, w;                              \
  };                                           \
  inline name make_##name(T x, T y, T z, T w) { return name{x, y, z, w}; }
RP_SIM_VEC2(float, float2, 8)
RP_SIM_VEC4(float, float4, 16)
RP_SIM_VEC2(int, int2, 8)
RP_SIM_VEC4(int, int4, 16)
RP_SIM_VEC2(unsigned int, uint2, 8)
RP_SIM_VEC4(unsigned int, uint4, 16)
RP_SIM_VEC2(double, double2, 16)
RP_SIM_VEC2(short, short2, 4)
RP_SIM_VEC2(unsigned short, ushort2, 4)
RP_SIM_VEC4(unsigned char, uchar4, 4)
RP_SIM_VEC2(long long, longlong2, 16)
struct float3 {
  float x, y, z;
};
inline float3 make_float3(float x, float y, float z) { return float3{x, y, z}; }
inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return uint3{x, y, z}; }

// ---- barriers and warp intrinsics ------------------------------------------------
inline void __syncthreads() { rp_sim_syncthreads(::rp_sim::kSyncPlain, 0); }
inline int __syncthreads_count(int p) { return rp_sim_syncthreads(::rp_sim::kSyncCount, p); }
inline int __syncthreads_and(int p) { return rp_sim_syncthreads(::rp_sim::kSyncAnd, p); }
inline int __syncthreads_or(int p) { return rp_sim_syncthreads(::rp_sim::kSyncOr, p); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  rp_sim_vote(::rp_sim::kSyncWarp, mask, 0);
}

namespace rp_sim {
template <typename T>
inline T shfl(int kind, unsigned mask, T var, int arg, int width) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
                "warp shuffles move at most 8 bytes of a trivially copyable type");
  uint64_t bits = 0;
  std::memcpy(&bits, &var, sizeof(T));
  bits = rp_sim_shfl(kind, mask, bits, arg, width);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}
}  // namespace rp_sim

template <typename T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {
  return rp_sim::shfl(rp_sim::kShflIdx, mask, var, src_lane, width);
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  return rp_sim::shfl(rp_sim::kShflUp, mask, var, int(delta), width);
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  return rp_sim::shfl(rp_sim::kShflDown, mask, var, int(delta), width);
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
  return rp_sim::shfl(rp_sim::kShflXor, mask, var, lane_mask, width);
}
inline unsigned __ballot_sync(unsigned mask, int p) {
  return rp_sim_vote(rp_sim::kVoteBallot, mask, p);
}
inline int __any_sync(unsigned mask, int p) { return int(rp_sim_vote(rp_sim::kVoteAny, mask, p)); }
inline int __all_sync(unsigned mask, int p) { return int(rp_sim_vote(rp_sim::kVoteAll, mask, p)); }

inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
[[noreturn]] inline void __trap() { rp_sim_trap("kernel called __trap()"); }

// ---- atomics (relaxed, as CUDA's) -------------------------------------------------
#define RP_SIM_ATOMIC_INT(T)                                                                   \
  inline T atomicAdd(T* a, T v) { return __atomic_fetch_add(a, v, __ATOMIC_RELAXED); }         \
  inline T atomicSub(T* a, T v) { return __atomic_fetch_sub(a, v, __ATOMIC_RELAXED); }         \
  inline T atomicExch(T* a, T v) { return __atomic_exchange_n(a, v, __ATOMIC_RELAXED); }       \
  inline T atomicAnd(T* a, T v) { return __atomic_fetch_and(a, v, __ATOMIC_RELAXED); }         \
  inline T atomicOr(T* a, T v) { return __atomic_fetch_or(a, v, __ATOMIC_RELAXED); }           \
  inline T atomicXor(T* a, T v) { return __atomic_fetch_xor(a, v, __ATOMIC_RELAXED); }         \
  inline T atomicCAS(T* a, T expected, T desired) {                                            \
    __atomic_compare_exchange_n(a, &expected, desired, false, __ATOMIC_RELAXED,                \
                                __ATOMIC_RELAXED);                                             \
    return expected;                                                                           \
  }                                                                                            \
  inline T atomicMax(T* a, T v) {                                                              \
    T old = __atomic_load_n(a, __ATOMIC_RELAXED);                                              \
    while (old < v && !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_RELAXED,         \
                                                   __ATOMIC_RELAXED)) {                        \
    }                                                                                          \
    return old;                                                                                \
  }                                                                                            \
  inline T atomicMin(T* a, T v) {                                                              \
    T old = __atomic_load_n(a, __ATOMIC_RELAXED);                                              \
    while (old > v && !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_RELAXED,         \
                                                   __ATOMIC_RELAXED)) {                        \
    }                                                                                          \
    return old;                                                                                \
  }
RP_SIM_ATOMIC_INT(int)
RP_SIM_ATOMIC_INT(unsigned int)
RP_SIM_ATOMIC_INT(unsigned long long)
RP_SIM_ATOMIC_INT(long long)

#define RP_SIM_ATOMIC_FLOAT(T, Bits)                                                           \
  inline T atomicAdd(T* a, T v) {                                                              \
    Bits* p = reinterpret_cast<Bits*>(a);                                                      \
    Bits old = __atomic_load_n(p, __ATOMIC_RELAXED), want;                                     \
    do {                                                                                       \
      T f;                                                                                     \
      std::memcpy(&f, &old, sizeof f);                                                         \
      f += v;                                                                                  \
      std::memcpy(&want, &f, sizeof f);                                                        \
    } while (!__atomic_compare_exchange_n(p, &old, want, true, __ATOMIC_RELAXED,               \
                                          __ATOMIC_RELAXED));                                  \
    T r;                                                                                       \
    std::memcpy(&r, &old, sizeof r);                                                           \
    return r;                                                                                  \
  }                                                                                            \
  inline T atomicExch(T* a, T v) {                                                             \
    Bits b;                                                                                    \
    std::memcpy(&b, &v, sizeof b);                                                             \
    b = __atomic_exchange_n(reinterpret_cast<Bits*>(a), b, __ATOMIC_RELAXED);                  \
    T r;                                                                                       \
    std::memcpy(&r, &b, sizeof r);                                                             \
    return r;                                                                                  \
  }
RP_SIM_ATOMIC_FLOAT(float, uint32_t)
RP_SIM_ATOMIC_FLOAT(double, uint64_t)

// ---- math intrinsics ---------------------------------------------------------------
// The fast-math intrinsics are computed exactly; CUDA's are within a few ulp.
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return exp10f(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __frsqrt_rn(float x) { return 1.0f / sqrtf(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }

inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
inline int __float_as_int(float f) {
  int i;
  std::memcpy(&i, &f, 4);
  return i;
}
inline float __uint_as_float(unsigned i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned i;
  std::memcpy(&i, &f, 4);
  return i;
}
inline double __longlong_as_double(long long i) {
  double d;
  std::memcpy(&d, &i, 8);
  return d;
}
inline long long __double_as_longlong(double d) {
  long long i;
  std::memcpy(&i, &d, 8);
  return i;
}

// CUDA overloads min and max for the arithmetic types in device code.
#define RP_SIM_MINMAX(T)                             \
  inline T min(T a, T b) { return b < a ? b : a; } \
  inline T max(T a, T b) { return a < b ? b : a; }
RP_SIM_MINMAX(int)
RP_SIM_MINMAX(unsigned int)
RP_SIM_MINMAX(long long)
RP_SIM_MINMAX(unsigned long long)
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x ? __builtin_clz(unsigned(x)) : 32; }
inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
// c + the dot product of a's and b's four bytes, as signed (int) or unsigned (unsigned) 8-bit integers.
inline int __dp4a(int a, int b, int c) {
  for (int i = 0; i < 4; ++i) c += int(static_cast<signed char>(a >> (8 * i))) * int(static_cast<signed char>(b >> (8 * i)));
  return c;
}
inline unsigned __dp4a(unsigned a, unsigned b, unsigned c) {
  for (int i = 0; i < 4; ++i) c += ((a >> (8 * i)) & 255u) * ((b >> (8 * i)) & 255u);
  return c;
}
inline int __mul24(int a, int b) { return a * b; }
inline unsigned __umul24(unsigned a, unsigned b) { return a * b; }
inline int __mulhi(int a, int b) { return int((long long)a * b >> 32); }
inline unsigned __umulhi(unsigned a, unsigned b) {
  return unsigned((unsigned long long)a * b >> 32);
}

template <typename T>
inline T __ldg(const T* p) {
  return *p;
}

// ---- the generated wrapper's side -------------------------------------------------
namespace rp_sim {

// How the launcher must pass each parameter: 0 pointer, 1 signed integer,
// 2 unsigned integer, 3 floating point, 4 bool, 5 anything else (by bytes).
template <typename T>
constexpr int param_kind() {
  if (std::is_pointer<T>::value) return 0;
  if (std::is_same<T, bool>::value) return 4;
  if (std::is_floating_point<T>::value) return 3;
  if (std::is_integral<T>::value) return std::is_signed<T>::value ? 1 : 2;
  return 5;
}

template <typename... Args>
int signature(void (*)(Args...), int* kinds, int* sizes, int max) {
  const int k[] = {param_kind<std::decay_t<Args>>()..., 0};
  const int s[] = {int(sizeof(std::decay_t<Args>))..., 0};
  for (int i = 0; i < int(sizeof...(Args)) && i < max; ++i) {
    kinds[i] = k[i];
    sizes[i] = s[i];
  }
  return int(sizeof...(Args));
}

// The kernel and copies of its arguments, unpacked from a void** array as
// cuLaunchKernel does; every fiber calls fn with them.
template <typename... Args>
struct Closure {
  void (*fn)(Args...);
  std::tuple<std::decay_t<Args>...> args;
};

template <typename... Args>
void run_closure(void* p) {
  auto* c = static_cast<Closure<Args...>*>(p);
  std::apply(c->fn, c->args);
}

template <typename... Args, size_t... I>
Closure<Args...> unpack(void (*fn)(Args...), void** argv, std::index_sequence<I...>) {
  return Closure<Args...>{
      fn, std::tuple<std::decay_t<Args>...>(*static_cast<std::decay_t<Args>*>(argv[I])...)};
}

template <typename... Args>
int launch_entry(void (*fn)(Args...), const char* name, const unsigned* grid,
                 const unsigned* block, size_t shared_mem, int workers, int debug, void** argv,
                 size_t capacity, void* (*dynamic_smem)(), char* err, size_t err_len,
                 uintptr_t* fault_addr) {
  Closure<Args...> closure = unpack(fn, argv, std::index_sequence_for<Args...>{});
  LaunchDesc d;
  d.kernel_name = name;
  for (int i = 0; i < 3; ++i) {
    d.grid[i] = grid[i];
    d.block[i] = block[i];
  }
  d.shared_mem = shared_mem;
  d.shared_capacity = capacity;
  d.workers = workers;
  d.debug = debug;
  d.body = &run_closure<Args...>;
  d.closure = &closure;
  d.dynamic_smem = dynamic_smem;
  return rp_sim_launch(&d, err, err_len, fault_addr);
}

}  // namespace rp_sim

// Dynamic shared memory: as much as sm_90 allows one block.
#define RP_SIM_DYNAMIC_SMEM_BYTES (227 * 1024)

#define RP_SIM_ENTRY(name, capacity, smem_fn)                                                   \
  extern "C" __attribute__((visibility("default"))) int rp_sim_entry_##name(                    \
      const unsigned* grid, const unsigned* block, size_t shared_mem, int workers, int debug,   \
      void** argv, char* err, size_t err_len, uintptr_t* fault_addr) {                          \
    return ::rp_sim::launch_entry(&name, #name, grid, block, shared_mem, workers, debug, argv, \
                                  capacity, smem_fn, err, err_len, fault_addr);                 \
  }                                                                                             \
  extern "C" __attribute__((visibility("default"))) int rp_sim_signature_##name(               \
      int* kinds, int* sizes, int max) {                                                        \
    return ::rp_sim::signature(&name, kinds, sizes, max);                                       \
  }

#endif  // RP_SIM_DISCOVER
