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
// Grid: (tiles, ceil(N / BN)). Each block computes one tile of out, stepping
// over K in BK-wide slices.
//
// Two kernels, the same tiles and grid order:
//   moe_grouped_gemm_f32: CUDA cores, float32 (tensor cores take 16-bit inputs).
//     Tile BM x BN = 32 x 64. Block: 256 threads. Each K slice of BK = 32 staged
//     in shared memory as float (x slice BM x BK, w slice BN x BK, each row padded
//     by one so that the inner loop's column reads hit 32 different banks). Thread
//     (ty, tx), ty = tid / 16, tx = tid % 16, owns rows 2 ty, 2 ty + 1 and columns
//     tx + 16 j (j = 0..3): neighbouring threads write neighbouring columns.
//   moe_grouped_gemm_mma_{f16,bf16}: tensor cores (mma.sync m16n8k16, mma.cuh).
//     Tile MMA_BM x BN = 64 x 64. Block: 4 warps; warp w owns rows 16 w .. 16 w + 16
//     and all 64 columns (8 m16n8 accumulators, 32 floats per lane). Each K slice
//     of 32 is staged as T in shared memory, rows padded to 40 elements (80 bytes:
//     16-byte aligned for ldmatrix, and 8 consecutive rows fall in different banks):
//       xs [64 rows][32 k]  row-major A: ldmatrix_x4 gives the 16 x 16 A fragment
//       ws [64 n  ][32 k]   W's rows are B's columns, k contiguous: exactly the
//                           "col" B operand, so plain ldmatrix_x4 gives the
//                           fragments of two n8 tiles at once.
//     Loads: 16-byte vectors when K % 8 == 0, element by element otherwise; zero
//     past every edge.
// Accumulation in float32 in both; x, w and out in T.
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

constexpr int MMA_BM = 64, LDS = BK + 8;  // rows per tile; shared row stride in elements (80 bytes)

// rows x BK elements of src (row stride K, `valid_rows` rows and K - k0 columns real)
// into dst [rows][LDS], zeros elsewhere; 128 threads, 8 elements each per step.
template <typename T, int ROWS>
__device__ __forceinline__ void stage_slice(T* dst, const T* __restrict__ src, int valid_rows, int k0, int K) {
  const bool vec = K % 8 == 0;  // then every 8-element chunk is 16-byte aligned and whole or absent
  for (int c = threadIdx.x; c < ROWS * BK / 8; c += blockDim.x) {
    const int r = c / (BK / 8), k = (c % (BK / 8)) * 8;
    T* d = dst + r * LDS + k;
    const T* g = src + i64(r) * K + k0 + k;
    if (vec) {
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (r < valid_rows && k0 + k < K) v = *reinterpret_cast<const uint4*>(g);
      *reinterpret_cast<uint4*>(d) = v;
    } else {
      for (int i = 0; i < 8; ++i) d[i] = (r < valid_rows && k0 + k + i < K) ? g[i] : from_float<T>(0.0f);
    }
  }
}

template <typename T>
__device__ void moe_grouped_gemm_mma(T* __restrict__ out,                  // [M, N]
                                     const T* __restrict__ x,              // [M, K], rows sorted by expert
                                     const T* __restrict__ w,              // [E, N, K]
                                     const int* __restrict__ tile_expert,  // [tiles]
                                     const int* __restrict__ tile_row,     // [tiles]
                                     const int* __restrict__ offsets,      // [E + 1]
                                     int N, int K) {
  __shared__ __align__(16) T xs[MMA_BM * LDS];
  __shared__ __align__(16) T ws[BN * LDS];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int e = tile_expert[blockIdx.x];
  const int r0 = tile_row[blockIdx.x];
  const int rows = min(MMA_BM, offsets[e + 1] - r0);
  const int n0 = blockIdx.y * BN;
  const T* xt = x + i64(r0) * K;
  const T* wt = w + (i64(e) * N + n0) * K;

  // This lane's ldmatrix row addresses (mma.cuh): A matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15)
  // in the order a[0..3]; B matrices (n tile j | j + 1) x (k 0-7 | 8-15).
  const int a_row = 16 * warp + lane % 8 + 8 * ((lane / 8) % 2), a_k = 8 * (lane / 16);
  const int b_n = lane % 8 + 8 * (lane / 16), b_k = 8 * ((lane / 8) % 2);

  float acc[8][4] = {};  // acc[j]: the m16n8 tile of columns 8 j .. 8 j + 8
  for (int k0 = 0; k0 < K; k0 += BK) {
    stage_slice<T, MMA_BM>(xs, xt, rows, k0, K);
    stage_slice<T, BN>(ws, wt, min(BN, N - n0), k0, K);
    __syncthreads();  // the slices are complete before any warp loads fragments

    // acc += x[16 warp .., k0 + 16 kk ..] w[n0 .., k0 + 16 kk ..]^T, two k-steps of 16
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      unsigned a[4];
      ldmatrix_x4(a, xs + a_row * LDS + 16 * kk + a_k);
#pragma unroll
      for (int j = 0; j < 8; j += 2) {
        unsigned b[4];
        ldmatrix_x4(b, ws + (8 * j + b_n) * LDS + 16 * kk + b_k);
        const unsigned b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
        mma_m16n8k16<T>(acc[j], a, b0);
        mma_m16n8k16<T>(acc[j + 1], a, b1);
      }
    }
    __syncthreads();  // every warp is done with the slices before the next overwrites them
  }

  // acc[j][0..1] = D[g][2t .. 2t+1], acc[j][2..3] = D[g + 8][2t ..] of tile j (g = lane / 4, t = lane % 4)
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 16 * warp + g + 8 * h;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int n = n0 + 8 * j + 2 * t + i;
        if (r < rows && n < N) out[i64(r0 + r) * N + n] = from_float<T>(acc[j][2 * h + i]);
      }
    }
  }
}

#define MOE_GEMM_MMA_ENTRY(T, suffix)                                                                      \
  extern "C" __global__ void moe_grouped_gemm_mma_##suffix(T* out, const T* x, const T* w,                \
                                                           const int* tile_expert, const int* tile_row,   \
                                                           const int* offsets, int N, int K) {            \
    moe_grouped_gemm_mma<T>(out, x, w, tile_expert, tile_row, offsets, N, K);                              \
  }

MOE_GEMM_MMA_ENTRY(__half, f16)
MOE_GEMM_MMA_ENTRY(__nv_bfloat16, bf16)

#define MOE_GEMM_ENTRY(T, suffix)                                                                          \
  extern "C" __global__ void moe_grouped_gemm_##suffix(T* out, const T* x, const T* w, const int* tile_expert, \
                                                       const int* tile_row, const int* offsets, int N, int K) { \
    moe_grouped_gemm<T>(out, x, w, tile_expert, tile_row, offsets, N, K);                                  \
  }

MOE_GEMM_ENTRY(float, f32)
