// A kernel with a compile error on line 4, for the error-message test.
extern "C" __global__ void broken(float* out) {
  float x = 1.0f;
  out[0] = x +;
}
