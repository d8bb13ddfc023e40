// Kernels whose global-memory traffic is known exactly, for test_traffic.py.
#include "common.cuh"

// out[i] = 2 * in[i] as 16-byte vectors: n/4 reads and n/4 writes of 16 bytes.
extern "C" __global__ void scale_vec4(float* out, const float* in, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (4 * i >= n) return;
  float4 v = reinterpret_cast<const float4*>(in)[i];
  v.x *= 2.0f, v.y *= 2.0f, v.z *= 2.0f, v.w *= 2.0f;
  reinterpret_cast<float4*>(out)[i] = v;
}

// Every block sums all of x (each thread a strided part, into its own slot of
// `partial`): each byte of x is read gridDim.x times but is one distinct byte.
extern "C" __global__ void reread(float* partial, const float* x, int n) {
  float s = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  partial[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

// In place read-modify-write of 2-byte elements: counts a read and a write each.
extern "C" __global__ void increment_half(__half* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = __float2half(__half2float(x[i]) + 1.0f);
}
