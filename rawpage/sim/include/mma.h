// The simulator's <mma.h>: nvcuda::wmma for the m16n16k16 shape with half or
// bfloat16 inputs and float (or half) accumulators, emulated at warp level.
//
// As on the GPU, a fragment is spread over the 32 lanes of a warp: each lane
// holds 8 of the tile's 256 elements, in the layout of the PTX mma.m16n8k16
// accumulator (lane / 4 picks the row, lane % 4 the column pair). Kernels must
// not depend on that layout (CUDA leaves it unspecified); element-wise
// operations over frag.x[] are fine. load/store read and write each lane's own
// elements and then wait for the whole warp; mma_sync is a warp collective
// whose last arriving lane gathers A, B and C from every lane, multiplies in
// float, and scatters D back.
#pragma once
#ifndef RP_SIM_DISCOVER

#include "cuda_bf16.h"
#include "cuda_fp16.h"

namespace nvcuda {
namespace wmma {

struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16,
                "the simulator implements WMMA's m16n16k16 shape only");
  static constexpr int num_elements = 8;
  T x[num_elements];
};

namespace detail {

// (row, col) in the 16x16 tile of element i held by `lane`.
inline int row_of(unsigned lane, int i) { return int(lane >> 2) + 8 * ((i >> 1) & 1); }
inline int col_of(unsigned lane, int i) { return int(lane & 3) * 2 + (i & 1) + 8 * (i >> 2); }

inline float to_f32(float v) { return v; }
inline float to_f32(__half v) { return float(v); }
inline float to_f32(__nv_bfloat16 v) { return float(v); }
template <typename T>
inline T from_f32(float v) {
  return T(v);
}

template <typename T>
inline void load(T* x, const T* p, unsigned ldm, bool row_major) {
  const unsigned lane = rp_sim::self()->lane;
  for (int i = 0; i < 8; ++i) {
    const int r = row_of(lane, i), c = col_of(lane, i);
    x[i] = row_major ? p[r * ldm + c] : p[c * ldm + r];
  }
  __syncwarp();
}

template <typename T>
inline void store(T* p, const T* x, unsigned ldm, bool row_major) {
  const unsigned lane = rp_sim::self()->lane;
  for (int i = 0; i < 8; ++i) {
    const int r = row_of(lane, i), c = col_of(lane, i);
    (row_major ? p[r * ldm + c] : p[c * ldm + r]) = x[i];
  }
  __syncwarp();
}

struct MmaArgs {
  void* d;
  const void* a;
  const void* b;
  const void* c;
};

// D = A B + C for the whole warp, run by the lane that arrives last.
template <typename TA, typename TB, typename TC, typename TD>
void mma_complete(void* const* lane_args, unsigned lanes) {
  if (lanes != 0xffffffffu) rp_sim_trap("mma_sync needs all 32 lanes of the warp");
  float A[16][16], B[16][16], C[16][16];
  for (unsigned l = 0; l < 32; ++l) {
    const auto* m = static_cast<const MmaArgs*>(lane_args[l]);
    for (int i = 0; i < 8; ++i) {
      const int r = row_of(l, i), c = col_of(l, i);
      A[r][c] = to_f32(static_cast<const TA*>(m->a)[i]);
      B[r][c] = to_f32(static_cast<const TB*>(m->b)[i]);
      C[r][c] = to_f32(static_cast<const TC*>(m->c)[i]);
    }
  }
  float D[16][16];
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 16; ++c) {
      float acc = C[r][c];
      for (int k = 0; k < 16; ++k) acc += A[r][k] * B[k][c];
      D[r][c] = acc;
    }
  }
  for (unsigned l = 0; l < 32; ++l) {
    auto* d = static_cast<TD*>(static_cast<const MmaArgs*>(lane_args[l])->d);
    for (int i = 0; i < 8; ++i) d[i] = from_f32<TD>(D[row_of(l, i)][col_of(l, i)]);
  }
}

}  // namespace detail

template <typename T, typename L>
inline void load_matrix_sync(fragment<matrix_a, 16, 16, 16, T, L>& f, const T* p, unsigned ldm) {
  detail::load(f.x, p, ldm, std::is_same<L, row_major>::value);
}

template <typename T, typename L>
inline void load_matrix_sync(fragment<matrix_b, 16, 16, 16, T, L>& f, const T* p, unsigned ldm) {
  detail::load(f.x, p, ldm, std::is_same<L, row_major>::value);
}

template <typename T>
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, T>& f, const T* p, unsigned ldm,
                             layout_t layout) {
  detail::load(f.x, p, ldm, layout == mem_row_major);
}

template <typename T>
inline void store_matrix_sync(T* p, const fragment<accumulator, 16, 16, 16, T>& f, unsigned ldm,
                              layout_t layout) {
  detail::store(p, f.x, ldm, layout == mem_row_major);
}

template <typename Use, typename T, typename L, typename V>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, L>& f, const V& v) {
  for (int i = 0; i < 8; ++i) f.x[i] = T(v);
}

template <typename TA, typename LA, typename TB, typename LB, typename TC, typename TD>
inline void mma_sync(fragment<accumulator, 16, 16, 16, TD>& d,
                     const fragment<matrix_a, 16, 16, 16, TA, LA>& a,
                     const fragment<matrix_b, 16, 16, 16, TB, LB>& b,
                     const fragment<accumulator, 16, 16, 16, TC>& c) {
  detail::MmaArgs args{d.x, a.x, b.x, c.x};
  rp_sim_warp_collective(0xffffffffu, &detail::mma_complete<TA, TB, TC, TD>, &args);
}

}  // namespace wmma
}  // namespace nvcuda

#endif  // RP_SIM_DISCOVER
