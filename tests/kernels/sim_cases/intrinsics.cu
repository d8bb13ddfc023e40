// Small kernels that pin down the simulator's CUDA semantics, one intrinsic
// family each (tests/kernels/test_simulator.py).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

// out[t] = each shuffle flavour of v = 100 * lane + warp, for width 32 and 8
extern "C" __global__ void shuffles(int* out, int src, int delta) {
  const int lane = threadIdx.x % 32, v = 100 * lane + int(threadIdx.x / 32);
  int* o = out + threadIdx.x * 8;
  o[0] = __shfl_sync(0xffffffffu, v, src);
  o[1] = __shfl_up_sync(0xffffffffu, v, delta);
  o[2] = __shfl_down_sync(0xffffffffu, v, delta);
  o[3] = __shfl_xor_sync(0xffffffffu, v, delta);
  o[4] = __shfl_sync(0xffffffffu, v, src, 8);
  o[5] = __shfl_up_sync(0xffffffffu, v, delta, 8);
  o[6] = __shfl_down_sync(0xffffffffu, v, delta, 8);
  o[7] = __shfl_xor_sync(0xffffffffu, v, delta, 8);
}

extern "C" __global__ void shuffle_types(float* f, __half* h, double* d) {
  const int t = threadIdx.x;
  f[t] = __shfl_xor_sync(0xffffffffu, f[t], 1);
  h[t] = __shfl_down_sync(0xffffffffu, h[t], 3);
  d[t] = __shfl_sync(0xffffffffu, d[t], 31);
}

// votes[t] = (ballot, any, all) of pred[t]; syncs[t] = (count, and, or) over the block
extern "C" __global__ void votes(unsigned* out, const int* pred) {
  const int p = pred[threadIdx.x];
  out[threadIdx.x * 6 + 0] = __ballot_sync(0xffffffffu, p);
  out[threadIdx.x * 6 + 1] = __any_sync(0xffffffffu, p);
  out[threadIdx.x * 6 + 2] = __all_sync(0xffffffffu, p);
  out[threadIdx.x * 6 + 3] = __syncthreads_count(p);
  out[threadIdx.x * 6 + 4] = __syncthreads_and(p);
  out[threadIdx.x * 6 + 5] = __syncthreads_or(p);
}

// Every thread of every block adds to the same counters.
extern "C" __global__ void atomics(int* counter, float* fsum, int* maximum, unsigned* cas_wins) {
  const int id = blockIdx.x * blockDim.x + threadIdx.x;
  atomicAdd(counter, 1);
  atomicAdd(fsum, 0.5f);
  atomicMax(maximum, id);
  if (atomicCAS(cas_wins, 0u, unsigned(id + 1)) == 0u) atomicAdd(cas_wins + 1, 1u);
}

// 3-D grids and blocks: every thread writes its flat global index at its own place.
extern "C" __global__ void indices(int* out) {
  const int block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const int thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int threads = blockDim.x * blockDim.y * blockDim.z;
  out[block * threads + thread] = block * 10000 + thread;
}

// Static and dynamic shared memory: reverse x within each block.
extern "C" __global__ void reverse_in_shared(float* out, const float* x) {
  extern __shared__ float dyn[];
  __shared__ int base;
  if (threadIdx.x == 0) base = blockIdx.x * blockDim.x;
  __syncthreads();  // base is set
  dyn[threadIdx.x] = x[base + threadIdx.x];
  __syncthreads();  // dyn is filled
  out[base + threadIdx.x] = dyn[blockDim.x - 1 - threadIdx.x];
}

// Conversions: float -> half and bfloat16 bits (round to nearest even) and back.
extern "C" __global__ void conversions(unsigned short* h, unsigned short* b, float* h_back,
                                       float* b_back, const float* x, int n) {
  for (int i = threadIdx.x + blockIdx.x * blockDim.x; i < n; i += blockDim.x * gridDim.x) {
    const __half hv = __float2half_rn(x[i]);
    const __nv_bfloat16 bv = __float2bfloat16_rn(x[i]);
    h[i] = __half_as_ushort(hv);
    b[i] = __bfloat16_as_ushort(bv);
    h_back[i] = __half2float(hv);
    b_back[i] = __bfloat162float(bv);
  }
}

// C = A B (+ C0) * scale through WMMA, A and B in either layout; also
// exercises element-wise operations on an accumulator fragment.
template <typename T, typename LA, typename LB>
__device__ void wmma_gemm(float* c, const T* a, const T* b, const float* c0, float scale) {
  using namespace nvcuda;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LA> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LB> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::load_matrix_sync(fc, c0, 16, wmma::mem_col_major);
  wmma::mma_sync(fc, fa, fb, fc);
  for (int i = 0; i < fc.num_elements; ++i) fc.x[i] *= scale;
  wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}

extern "C" __global__ void wmma_f16_row_col(float* c, const __half* a, const __half* b,
                                            const float* c0, float scale) {
  wmma_gemm<__half, nvcuda::wmma::row_major, nvcuda::wmma::col_major>(c, a, b, c0, scale);
}
extern "C" __global__ void wmma_f16_col_row(float* c, const __half* a, const __half* b,
                                            const float* c0, float scale) {
  wmma_gemm<__half, nvcuda::wmma::col_major, nvcuda::wmma::row_major>(c, a, b, c0, scale);
}
extern "C" __global__ void wmma_bf16_row_row(float* c, const __nv_bfloat16* a,
                                             const __nv_bfloat16* b, const float* c0, float scale) {
  wmma_gemm<__nv_bfloat16, nvcuda::wmma::row_major, nvcuda::wmma::row_major>(c, a, b, c0, scale);
}

// ---- programs the simulator must refuse -----------------------------------------------

extern "C" __global__ void divergent_shuffle(float* out) {
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

extern "C" __global__ void different_collectives(float* out) {
  if (threadIdx.x < 16)
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
  else
    out[threadIdx.x] = float(__ballot_sync(0xffffffffu, 1));
}

// Lanes 0-15 wait in a full-warp shuffle for lanes 16-31, which wait at the
// barrier for them: a deadlock (a hang on a GPU).
extern "C" __global__ void shuffle_waits_for_a_barrier(float* out) {
  if (threadIdx.x % 32 < 16) out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
  __syncthreads();
  out[threadIdx.x] += 1.0f;
}

extern "C" __global__ void index_past_the_end(float* out, int stride) {
  out[threadIdx.x * stride] = 1.0f;
}

extern "C" __global__ void index_before_the_start(float* out) { out[int(threadIdx.x) - 1000] = 1.0f; }

extern "C" __global__ void deep_recursion_stack(float* out, int n) {
  volatile float big[64 * 1024];  // 256 KiB: more than a fiber's stack
  big[n] = 1.0f;
  out[0] = big[n];
}

extern "C" __global__ void traps(float* out) {
  if (threadIdx.x == 3) __trap();
  out[threadIdx.x] = 1.0f;
}

extern "C" __global__ void writes_past_dynamic_smem(float* out, int n) {
  extern __shared__ float dyn[];
  dyn[n] = 1.0f;
  out[0] = dyn[0];
}

extern "C" __global__ void takes_scalars(float* out, float f, int i, unsigned u, long long l) {
  out[0] = f;
  out[1] = float(i);
  out[2] = float(u);
  out[3] = float(l);
}
