// The experts of a mixture-of-experts layer as one grouped GEMM:
//
//   out[r, n] = sum_k x[r, k] w[e, n, k]      for every row r in expert e's group,
//   group e = rows offsets[e] .. offsets[e+1)
//
// The caller sorted the (token, expert) pairs of the step by expert, so each
// expert's tokens are one run of rows of x (M = T * top_k rows in all). An
// expert with no tokens has an empty run and costs nothing; one that took
// every token has a run of T rows. One launch covers all experts.
//
// Tiles. The launch code cuts every non-empty group into row tiles of BM rows
// (the last one short) and lists them: tile i is rows tile_row[i] ..
// min(tile_row[i] + BM, offsets[e + 1]) of expert e = tile_expert[i]. So the
// grid never holds a block for an idle expert, and no block reads the device
// offsets to find its work beyond its own group's end.
//
// Grid: (tiles, ceil(N / BN)). Block: 256 threads. Each block computes a
// BM x BN tile of out, stepping over K in BK-wide slices staged in shared
// memory as float (x slice BM x BK, w slice BN x BK, each row padded by one so
// that the inner loop's column reads hit 32 different banks). Thread (ty, tx),
// ty = tid / 16, tx = tid % 16, owns rows 2 ty, 2 ty + 1 and columns tx + 16 j
// (j = 0..3): neighbouring threads write neighbouring columns.
//
// Accumulation in float32; x, w and out in T (float, half, bfloat16).
// This is a CUDA-core kernel: correct for every shape, and the seam where a
// tensor-core (mma.sync) version goes when gpu_check shows MoE prefill matters.
#include "common.cuh"

using namespace rawpage;

constexpr int BM = 32, BN = 64, BK = 32;

template <typename T>
__device__ void moe_grouped_gemm(T* __restrict__ out,                // [M, N]
                                 const T* __restrict__ x,            // [M, K], rows sorted by expert
                                 const T* __restrict__ w,            // [E, N, K]
                                 const int* __restrict__ tile_expert,  // [tiles]
                                 const int* __restrict__ tile_row,   // [tiles], first row of the tile
                                 const int* __restrict__ offsets,    // [E + 1], group e = offsets[e] .. offsets[e+1)
                                 int N, int K) {
  __shared__ float xs[BM][BK + 1];
  __shared__ float ws[BN][BK + 1];
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
  const int e = tile_expert[blockIdx.x];
  const int r0 = tile_row[blockIdx.x];
  const int rows = min(BM, offsets[e + 1] - r0);  // rows of this tile
  const int n0 = blockIdx.y * BN;
  const T* we = w + i64(e) * N * K;

  float acc[2][4] = {};
  for (int k0 = 0; k0 < K; k0 += BK) {
    // Stage x[r0 .., k0 ..) and w[e, n0 .., k0 ..), zero past the edges.
    for (int i = tid; i < BM * BK; i += blockDim.x) {
      const int r = i / BK, c = i % BK;
      xs[r][c] = (r < rows && k0 + c < K) ? to_float(x[i64(r0 + r) * K + k0 + c]) : 0.0f;
    }
    for (int i = tid; i < BN * BK; i += blockDim.x) {
      const int n = i / BK, c = i % BK;
      ws[n][c] = (n0 + n < N && k0 + c < K) ? to_float(we[i64(n0 + n) * K + k0 + c]) : 0.0f;
    }
    __syncthreads();  // the slices are complete before anyone reads them

    // acc[i][j] += x[2 ty + i, k0 + kk] w[n0 + tx + 16 j, k0 + kk]
    for (int kk = 0; kk < BK; ++kk) {
      const float a0 = xs[2 * ty][kk], a1 = xs[2 * ty + 1][kk];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float bw = ws[tx + 16 * j][kk];
        acc[0][j] += a0 * bw;
        acc[1][j] += a1 * bw;
      }
    }
    __syncthreads();  // everyone is done with the slices before the next overwrites them
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = 2 * ty + i;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int n = n0 + tx + 16 * j;
      if (r < rows && n < N) out[i64(r0 + r) * N + n] = from_float<T>(acc[i][j]);
    }
  }
}

#define MOE_GEMM_ENTRY(T, suffix)                                                                          \
  extern "C" __global__ void moe_grouped_gemm_##suffix(T* out, const T* x, const T* w, const int* tile_expert, \
                                                       const int* tile_row, const int* offsets, int N, int K) { \
    moe_grouped_gemm<T>(out, x, w, tile_expert, tile_row, offsets, N, K);                                  \
  }

MOE_GEMM_ENTRY(float, f32)
MOE_GEMM_ENTRY(__half, f16)
MOE_GEMM_ENTRY(__nv_bfloat16, bf16)
