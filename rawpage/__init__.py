"""rawpage: PagedAttention and continuous batching, on NumPy, CuPy and our own CUDA kernels."""

__version__ = "0.1.0"
