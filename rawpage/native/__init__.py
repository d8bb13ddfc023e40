"""The CPU's native kernels: C with intrinsics, compiled at first use, called through ctypes.

    isa.py        which instruction-set path this CPU runs (avx512vnni, avxvnni, avx2,
                  scalar), and $RAWPAGE_CPU_ISA to force a lower one
    build.py      compiles every *.c here into one shared library per path, cached
                  like the simulator's builds (rawpage/compile_cache.py)
    library.py    loads it (or says in one log line why not) and declares each entry point
    *.c, *.h      the kernels; each file opens with its math, its data layout and how
                  its work is split over threads (pool.c runs the split)
    gguf.py       GGUF weights kept in their blocks: gguf_matmul (int8 dot products,
                  gguf_matmul.c) and gguf_rows (a packed embedding table's rows)

Python calls a kernel with NumPy arrays' addresses; ctypes lets go of the GIL for the
call, and the kernel splits its rows over the C thread pool. Every kernel has a NumPy
reference in rawpage/ops, and the tests hold each path this machine runs against it.
"""
