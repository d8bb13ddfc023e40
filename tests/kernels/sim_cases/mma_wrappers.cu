// Each PTX wrapper of cuda/mma.cuh alone, one warp, registers in and out as raw
// 32-bit words, so that tests/kernels/test_mma.py checks every lane's fragment
// against the PTX ISA layout and a NumPy matrix product. Built with cuda/ on
// the include path.
#include "common.cuh"

using namespace rawpage;

// d[lane] = (A B + C) fragment, from each lane's a[lane][4], b[lane][2], c[lane][4].
template <typename T>
__device__ void mma_regs(float* d, const unsigned* a, const unsigned* b, const float* c) {
  const int lane = threadIdx.x;
  unsigned ra[4] = {a[4 * lane], a[4 * lane + 1], a[4 * lane + 2], a[4 * lane + 3]};
  unsigned rb[2] = {b[2 * lane], b[2 * lane + 1]};
  float rd[4] = {c[4 * lane], c[4 * lane + 1], c[4 * lane + 2], c[4 * lane + 3]};
  mma_m16n8k16<T>(rd, ra, rb);
  for (int i = 0; i < 4; ++i) d[4 * lane + i] = rd[i];
}
extern "C" __global__ void mma_regs_f16(float* d, const unsigned* a, const unsigned* b, const float* c) {
  mma_regs<__half>(d, a, b, c);
}
extern "C" __global__ void mma_regs_bf16(float* d, const unsigned* a, const unsigned* b, const float* c) {
  mma_regs<__nv_bfloat16>(d, a, b, c);
}

// m: 32 rows of 8 16-bit elements, staged in shared memory with a 24-element
// pitch. Lane l gives the address of row rows[l] (so matrix l/8, row l%8 is
// m[rows[l]]); out[lane] = the x4 registers, then the x4.trans registers.
extern "C" __global__ void ldmatrix_regs(unsigned* out, const unsigned short* m, const int* rows) {
  __shared__ __align__(16) unsigned short tile[32 * 24];
  const int lane = threadIdx.x;
  for (int e = 0; e < 8; ++e) tile[lane * 24 + e] = m[lane * 8 + e];
  __syncwarp();  // the whole tile is staged before any lane's rows are read
  unsigned r[4], rt[4];
  ldmatrix_x4(r, tile + rows[lane] * 24);
  ldmatrix_x4_trans(rt, tile + rows[lane] * 24);
  for (int j = 0; j < 4; ++j) {
    out[8 * lane + j] = r[j];
    out[8 * lane + 4 + j] = rt[j];
  }
}

// 64 chunks of 16 bytes through shared memory in two cp.async groups (chunks
// 0..31, then 32..63); chunk i is copied if valid[i], else zero-filled.
// out[0..31]: group 0 after wait_group 1; out[32..63]: group 1 after
// wait_group 0; early: group 1 read before its wait, a bug on purpose, which
// the simulator answers with its poison (all ones).
extern "C" __global__ void cp_async_roundtrip(uint4* out, uint4* early, const uint4* src, const int* valid) {
  __shared__ __align__(16) uint4 stage[64];
  const int lane = threadIdx.x;
  cp_async_16(&stage[lane], &src[lane], valid[lane] != 0);
  cp_async_commit();
  cp_async_16(&stage[32 + lane], &src[32 + lane], valid[32 + lane] != 0);
  cp_async_commit();
  cp_async_wait<1>();  // this lane's first group has landed
  __syncwarp();        // ... and every lane's
  out[lane] = stage[lane ^ 1];
  early[lane] = stage[32 + (lane ^ 1)];
  __syncwarp();  // every lane has read `early` before any lane retires group 1
  cp_async_wait<0>();
  __syncwarp();
  out[32 + lane] = stage[32 + (lane ^ 1)];
}

// The way the attention kernel composes them: S = Q K^T (16x16, two n-tiles of
// 8 keys, two k-steps of 16) with Q and K rows through ldmatrix_x4, and
// O = Q[:, :16] V (16x16) with V through ldmatrix_x4_trans.
template <typename T>
__device__ void qk_pv(float* s, float* o, const T* q, const T* k, const T* v) {
  __shared__ __align__(16) T Qs[16 * 40], Ks[16 * 40], Vs[16 * 24];  // padded pitches
  const int lane = threadIdx.x;
  for (int i = lane; i < 16 * 32; i += 32) {
    Qs[i / 32 * 40 + i % 32] = q[i];
    Ks[i / 32 * 40 + i % 32] = k[i];
  }
  for (int i = lane; i < 16 * 16; i += 32) Vs[i / 16 * 24 + i % 16] = v[i];
  __syncwarp();  // tiles staged
  const int g = lane / 4, t = lane % 4;
  float acc_s[2][4] = {}, acc_o[2][4] = {};
  for (int kk = 0; kk < 2; ++kk) {
    unsigned a[4], b[4];
    // A: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15)
    ldmatrix_x4(a, Qs + (lane % 16) * 40 + kk * 16 + (lane / 16) * 8);
    // B for keys n..n+7: (keys 0-7, k 0-7), (keys 0-7, k 8-15), (keys 8-15, k 0-7), (keys 8-15, k 8-15)
    ldmatrix_x4(b, Ks + ((lane / 16) * 8 + lane % 8) * 40 + kk * 16 + ((lane / 8) % 2) * 8);
    const unsigned b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
    mma_m16n8k16<T>(acc_s[0], a, b0);
    mma_m16n8k16<T>(acc_s[1], a, b1);
  }
  unsigned a[4], b[4];
  ldmatrix_x4(a, Qs + (lane % 16) * 40 + (lane / 16) * 8);
  // B = V (k = key rows, n = dims): matrices (keys 0-7, dims 0-7), (keys 8-15, dims 0-7),
  // (keys 0-7, dims 8-15), (keys 8-15, dims 8-15), each transposed
  ldmatrix_x4_trans(b, Vs + (lane % 16) * 24 + (lane / 16) * 8);
  const unsigned b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
  mma_m16n8k16<T>(acc_o[0], a, b0);
  mma_m16n8k16<T>(acc_o[1], a, b1);
  for (int n = 0; n < 2; ++n)
    for (int i = 0; i < 4; ++i) {
      const int r = g + 8 * (i / 2), c = 8 * n + 2 * t + i % 2;
      s[r * 16 + c] = acc_s[n][i];
      o[r * 16 + c] = acc_o[n][i];
    }
}
extern "C" __global__ void qk_pv_f16(float* s, float* o, const __half* q, const __half* k, const __half* v) {
  qk_pv<__half>(s, o, q, k, v);
}
extern "C" __global__ void qk_pv_bf16(float* s, float* o, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                      const __nv_bfloat16* v) {
  qk_pv<__nv_bfloat16>(s, o, q, k, v);
}

// ldmatrix from row addresses `off` elements past 16-byte boundaries: with
// off != 0 (a row pitch that is not a multiple of 8 elements, say) the
// hardware's alignment rule is broken, and the simulator traps.
extern "C" __global__ void ldmatrix_misaligned(unsigned* out, int off) {
  __shared__ __align__(16) unsigned short tile[32 * 16 + 8];
  for (int e = 0; e < 16; ++e) tile[threadIdx.x * 16 + e] = 0;
  __syncwarp();  // tile staged
  unsigned r[4];
  ldmatrix_x4(r, tile + threadIdx.x * 16 + off);
  out[threadIdx.x] = r[0];
}
