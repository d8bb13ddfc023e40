// Tensor-core building blocks: each PTX instruction the kernels use, behind one
// small device function. On the GPU each is one inline asm statement (sm_80 and
// later); under the simulator (RAWPAGE_SIM) each is a C++ emulation that moves
// data between the lanes of the warp exactly as the PTX ISA documents
// (rawpage/sim/include/ptx_emu.h), so the kernels run unmodified on both.
//
// A separate file from common.cuh because it is one concept (moving tiles into
// tensor-core fragments and multiplying them) that only the attention kernels
// need; common.cuh includes it, so kernel files still include only common.cuh.
//
// Fragment layouts of mma.m16n8k16 with 16-bit inputs (g = lane / 4,
// t = lane % 4; a register holds two elements, the lower-indexed in the low half):
//   A (16x16, row major):  a[0] = A[g][2t..2t+1]    a[1] = A[g+8][2t..2t+1]
//                          a[2] = A[g][2t+8..2t+9]  a[3] = A[g+8][2t+8..2t+9]
//   B (16x8,  "col":  each column n = g contiguous in k):
//                          b[0] = B[2t..2t+1][g]    b[1] = B[2t+8..2t+9][g]
//   C, D (16x8, float):    d[0..1] = D[g][2t..2t+1] d[2..3] = D[g+8][2t..2t+1]
// ldmatrix hands out exactly these pieces: for 8x8 matrix j, lanes 8j .. 8j+7
// give the addresses of its 8 rows (16 bytes each), and lane l receives row
// l/4, elements 2(l%4) and 2(l%4)+1 in register j (".trans": column l/4,
// elements 2(l%4) and 2(l%4)+1 of it).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#ifdef RAWPAGE_SIM
#include <ptx_emu.h>
#endif

namespace rawpage {

template <typename T>
struct MmaType;  // the PTX name of a 16-bit input type
template <>
struct MmaType<__half> {
  static constexpr bool kBf16 = false;
};
template <>
struct MmaType<__nv_bfloat16> {
  static constexpr bool kBf16 = true;
};

// D += A B for one warp: A 16x16 and B 16x8 in T (__half or __nv_bfloat16),
// D 16x8 float. mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
#ifdef RAWPAGE_SIM
  rp_sim::ptx::mma_m16n8k16<MmaType<T>::kBf16>(d, a, b);
#else
  if constexpr (MmaType<T>::kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#endif
}

#ifndef RAWPAGE_SIM
__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
#endif

// Four 8x8 matrices of 16-bit elements from shared memory; this lane gives the
// address of row (lane % 8) of matrix (lane / 8), 16-byte aligned.
// ldmatrix.sync.aligned.m8n8.x4.shared.b16
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* smem_row) {
#ifdef RAWPAGE_SIM
  rp_sim::ptx::ldmatrix<4, false>(r, smem_row);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(smem_row)));
#endif
}

// The same, each matrix transposed on the way (ldmatrix ... .x4.trans.shared.b16).
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* smem_row) {
#ifdef RAWPAGE_SIM
  rp_sim::ptx::ldmatrix<4, true>(r, smem_row);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(smem_row)));
#endif
}

// 16 bytes global -> shared without passing through registers; `valid == false`
// writes 16 zero bytes and reads nothing (src-size 0). Asynchronous on the GPU:
// the data is there only after cp_async_wait for its group.
// cp.async.cg.shared.global [dst], [src], 16, src_size (cg: cached in L2 only)
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
#ifdef RAWPAGE_SIM
  rp_sim::ptx::cp_async_16(smem_dst, gmem_src, valid ? 16 : 0);
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem_dst)),
               "l"(gmem_src), "r"(valid ? 16 : 0));
#endif
}

// Closes the group of this thread's cp.async issued since the last commit.
__device__ __forceinline__ void cp_async_commit() {
#ifdef RAWPAGE_SIM
  rp_sim::ptx::cp_async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits until at most `kPending` of this thread's committed groups are still in
// flight. Only this thread's copies: a __syncthreads must follow before other
// threads read them. (The simulator performs the copies here, and poisons the
// destination until then: see ptx_emu.h.)
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#ifdef RAWPAGE_SIM
  rp_sim::ptx::cp_async_wait(kPending);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
#endif
}

// Two floats rounded to T, as one register of an A or B fragment (lo first).
template <typename T>
__device__ __forceinline__ unsigned pack2(float lo, float hi);
template <>
__device__ __forceinline__ unsigned pack2<__half>(float lo, float hi) {
  return unsigned(__half_as_ushort(__float2half_rn(lo))) | unsigned(__half_as_ushort(__float2half_rn(hi))) << 16;
}
template <>
__device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float lo, float hi) {
  return unsigned(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         unsigned(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16;
}

}  // namespace rawpage
