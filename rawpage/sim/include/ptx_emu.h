// The simulator's emulation of the inline PTX behind cuda/mma.cuh: mma.sync
// m16n8k16, ldmatrix and cp.async. cuda/mma.cuh includes this file under
// RAWPAGE_SIM instead of emitting the asm.
//
// mma and ldmatrix are warp collectives, as on the GPU: every lane hands its
// own registers (or its row address) to rp_sim_warp_collective, and the last
// lane to arrive moves the data between lanes following the fragment layouts
// of the PTX ISA (section "Matrix fragments for mma.m16n8k16", and the ldmatrix
// description), then every lane continues with its results. Lane l is in
// group g = l / 4, at position t = l % 4 within its group.
//
//   A (16x16, row):  a[0] = A[g][2t, 2t+1]      a[1] = A[g+8][2t, 2t+1]
//                    a[2] = A[g][2t+8, 2t+9]    a[3] = A[g+8][2t+8, 2t+9]
//   B (16x8, col):   b[0] = B[2t, 2t+1][g]      b[1] = B[2t+8, 2t+9][g]
//   C, D (16x8 f32): c[0], c[1] = C[g][2t, 2t+1]   c[2], c[3] = C[g+8][2t, 2t+1]
//
// (a 32-bit register holds two 16-bit elements, the lower-indexed one in the
// low half). The products are summed in float, in order of k; the GPU's
// tensor cores may round the partial sums differently, by an ulp or so.
//
// cp.async is deferred to the wait that retires it, with its destination
// poisoned meanwhile (see below), so that the pipeline hazards of a
// double-buffered kernel show up as NaN under the simulator too.
#pragma once
#ifndef RP_SIM_DISCOVER

#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "rp_sim_abi.h"

namespace rp_sim {
namespace ptx {

inline float lo_f32(uint32_t r, bool bf16) {
  return bf16 ? bf16_to_f32(uint16_t(r & 0xffff)) : f16_to_f32(uint16_t(r & 0xffff));
}
inline float hi_f32(uint32_t r, bool bf16) {
  return bf16 ? bf16_to_f32(uint16_t(r >> 16)) : f16_to_f32(uint16_t(r >> 16));
}

struct MmaLane {
  float* d;  // 4 accumulators in, D out (D = A B + C with C = d)
  const uint32_t* a;
  const uint32_t* b;
};

// The last lane of mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32.
template <bool kBf16>
void mma_m16n8k16_complete(void* const* lane_args, unsigned lanes) {
  if (lanes != 0xffffffffu) rp_sim_trap("mma.sync needs all 32 lanes of the warp");
  float A[16][16], B[16][8], C[16][8];
  for (unsigned l = 0; l < 32; ++l) {
    const auto* m = static_cast<const MmaLane*>(lane_args[l]);
    const int g = int(l / 4), t = int(l % 4);
    for (int i = 0; i < 4; ++i) {  // a[i]: rows g, g+8; column pairs 2t, 2t+8
      const int r = g + 8 * (i & 1), c = 2 * t + 8 * (i >> 1);
      A[r][c] = lo_f32(m->a[i], kBf16);
      A[r][c + 1] = hi_f32(m->a[i], kBf16);
    }
    for (int i = 0; i < 2; ++i) {  // b[i]: rows (k) 2t, 2t+8; column (n) g
      const int k = 2 * t + 8 * i;
      B[k][g] = lo_f32(m->b[i], kBf16);
      B[k + 1][g] = hi_f32(m->b[i], kBf16);
    }
    for (int i = 0; i < 4; ++i) C[g + 8 * (i >> 1)][2 * t + (i & 1)] = m->d[i];
  }
  for (unsigned l = 0; l < 32; ++l) {
    const auto* m = static_cast<const MmaLane*>(lane_args[l]);
    const int g = int(l / 4), t = int(l % 4);
    for (int i = 0; i < 4; ++i) {
      const int r = g + 8 * (i >> 1), c = 2 * t + (i & 1);
      float acc = C[r][c];
      for (int k = 0; k < 16; ++k) acc += A[r][k] * B[k][c];
      m->d[i] = acc;
    }
  }
}

template <bool kBf16>
inline void mma_m16n8k16(float* d, const uint32_t* a, const uint32_t* b) {
  MmaLane arg{d, a, b};
  rp_sim_warp_collective(0xffffffffu, &mma_m16n8k16_complete<kBf16>, &arg);
}

struct LdmatrixLane {
  uint32_t* r;          // this lane's destination registers, one per 8x8 matrix
  const uint8_t* row;   // the row this lane addresses (lanes 8j .. 8j+7: rows of matrix j)
};

// The last lane of ldmatrix.sync.aligned.m8n8.x{1,2,4}{,.trans}.shared.b16.
// Matrix j's row i is the 16 bytes at lane (8j + i)'s address. Without .trans,
// lane l receives M[l/4][2(l%4)], M[l/4][2(l%4)+1]: the A/B fragment of an 8x8
// piece. With .trans it receives M[2(l%4)][l/4], M[2(l%4)+1][l/4].
template <int kNum, bool kTrans>
void ldmatrix_complete(void* const* lane_args, unsigned lanes) {
  if (lanes != 0xffffffffu) rp_sim_trap("ldmatrix needs all 32 lanes of the warp");
  for (unsigned l = 0; l < 32; ++l) {
    auto* dst = static_cast<const LdmatrixLane*>(lane_args[l]);
    const int g = int(l / 4), t = int(l % 4);
    for (int j = 0; j < kNum; ++j) {
      uint16_t lo, hi;
      if (!kTrans) {
        const uint8_t* row = static_cast<const LdmatrixLane*>(lane_args[8 * j + g])->row;
        std::memcpy(&lo, row + 4 * t, 2);
        std::memcpy(&hi, row + 4 * t + 2, 2);
      } else {
        const uint8_t* row0 = static_cast<const LdmatrixLane*>(lane_args[8 * j + 2 * t])->row;
        const uint8_t* row1 = static_cast<const LdmatrixLane*>(lane_args[8 * j + 2 * t + 1])->row;
        std::memcpy(&lo, row0 + 2 * g, 2);
        std::memcpy(&hi, row1 + 2 * g, 2);
      }
      dst->r[j] = uint32_t(lo) | uint32_t(hi) << 16;
    }
  }
}

template <int kNum, bool kTrans>
inline void ldmatrix(uint32_t* r, const void* row) {
  if (reinterpret_cast<uintptr_t>(row) % 16)
    rp_sim_trap("ldmatrix: a row address is not 16-byte aligned");
  LdmatrixLane arg{r, static_cast<const uint8_t*>(row)};
  rp_sim_warp_collective(0xffffffffu, &ldmatrix_complete<kNum, kTrans>, &arg);
}

// cp.async, as late as the PTX memory model allows. A copy is only recorded
// when issued, and its 16 destination bytes are poisoned (all ones: NaN in
// float16, bfloat16 and float32); the source is read and the destination
// written when this thread's cp_async_wait retires the copy's group. So a
// kernel that reads a stage before waiting for it, or that refills a stage
// while another warp still reads it (a missing barrier), reads NaN here, as it
// might read stale data on a GPU. Groups and copies are per thread, kept in
// the running worker's slot for this thread and reset at each block start.
struct CpAsyncCopy {
  void* dst;
  const void* src;
  int src_size;
};

struct CpAsyncState {
  std::vector<CpAsyncCopy> copies;  // issued and not yet retired, in issue order
  std::vector<size_t> group_ends;   // copies[0, group_ends[i]) belong to groups 0..i
};

inline CpAsyncState& cp_async_state() {
  static thread_local CpAsyncState per_thread[1024];  // a block's threads, on this worker
  Thread* t = self();
  CpAsyncState& s = per_thread[t->linear];
  if (t->cp_async != &s) {  // first cp.async of this thread in this block
    s.copies.clear();
    s.group_ends.clear();
    t->cp_async = &s;
  }
  return s;
}

// cp.async.cg.shared.global [dst], [src], 16, src_size: src_size 16 copies,
// 0 fills the 16 bytes with zeros and reads nothing.
inline void cp_async_16(void* dst, const void* src, int src_size) {
  if (reinterpret_cast<uintptr_t>(dst) % 16 || (src_size && reinterpret_cast<uintptr_t>(src) % 16))
    rp_sim_trap("cp.async: a 16-byte copy needs 16-byte aligned addresses");
  cp_async_state().copies.push_back(CpAsyncCopy{dst, src, src_size});
  std::memset(dst, 0xff, 16);
}

// cp.async.commit_group: the copies issued since the last commit form a group.
inline void cp_async_commit() {
  CpAsyncState& s = cp_async_state();
  s.group_ends.push_back(s.copies.size());
}

// cp.async.wait_group n: retire every committed group but the newest n.
inline void cp_async_wait(int pending) {
  CpAsyncState& s = cp_async_state();
  const int groups = int(s.group_ends.size());
  if (groups <= pending) return;
  const size_t done = s.group_ends[groups - pending - 1];
  for (size_t i = 0; i < done; ++i) {
    const CpAsyncCopy& c = s.copies[i];
    if (c.src_size)
      std::memcpy(c.dst, c.src, 16);
    else
      std::memset(c.dst, 0, 16);
  }
  s.copies.erase(s.copies.begin(), s.copies.begin() + done);
  s.group_ends.erase(s.group_ends.begin(), s.group_ends.begin() + (groups - pending));
  for (size_t& end : s.group_ends) end -= done;
}

}  // namespace ptx
}  // namespace rp_sim

#endif  // RP_SIM_DISCOVER
