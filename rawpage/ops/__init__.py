"""The ops the model calls, one module each.

Every module holds the op's NumPy reference (the readable definition, used by
the `cpu` backend and by the kernel tests) and, for the GPU-style backends, the
launch code of its CUDA kernel in `cuda/`.
"""
