/* The read bandwidth the kernels are held to (tools/bench_cpu_kernels.py): every byte of
 * a buffer read once, as a GEMV reads its weight, with nothing else to do.
 *
 *     out = OR over the buffer's 64-byte lines (so that the reads cannot be dropped)
 *
 * A NumPy reduction is a poor reference here: its float32 sum is bound by the adds on
 * one thread (16-23 GB/s on the development VM, where this reads 26+), so a kernel
 * could look faster than memory. This loop has the kernels' shape: wide loads, several
 * independent accumulators, the buffer split in contiguous parts over the pool's threads.
 *
 * Layout: buf is n bytes, n a multiple of 64 (the caller rounds down). Work split:
 * contiguous ranges of whole 4 KB pages, one per thread (rp_split).
 */
#include "common.h"

typedef struct {
    const uint8_t *buf;
    int64_t n;
    uint64_t part[256]; /* each thread's OR, combined by the caller */
} read_args;

static void read_task(void *arg, int ith, int nth) {
    read_args *a = arg;
    int64_t b, e;
    rp_split(a->n, 4096, ith, nth, &b, &e);
    uint64_t acc = 0;
#if RP_AVX2
    __m256i v0 = _mm256_setzero_si256(), v1 = v0, v2 = v0, v3 = v0;
    int64_t i = b;
    for (; i + 128 <= e; i += 128) {
        v0 = _mm256_or_si256(v0, _mm256_loadu_si256((const __m256i *)(a->buf + i)));
        v1 = _mm256_or_si256(v1, _mm256_loadu_si256((const __m256i *)(a->buf + i + 32)));
        v2 = _mm256_or_si256(v2, _mm256_loadu_si256((const __m256i *)(a->buf + i + 64)));
        v3 = _mm256_or_si256(v3, _mm256_loadu_si256((const __m256i *)(a->buf + i + 96)));
    }
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, _mm256_or_si256(_mm256_or_si256(v0, v1), _mm256_or_si256(v2, v3)));
    acc = lanes[0] | lanes[1] | lanes[2] | lanes[3];
    for (; i + 8 <= e; i += 8) {
        uint64_t w;
        memcpy(&w, a->buf + i, 8);
        acc |= w;
    }
#else
    for (int64_t i = b; i + 8 <= e; i += 8) {
        uint64_t w;
        memcpy(&w, a->buf + i, 8);
        acc |= w;
    }
#endif
    a->part[ith] = acc;
}

/* The OR of buf's 8-byte words (n bytes, n a multiple of 8), read on nthreads threads. */
RP_EXPORT uint64_t rp_read_probe(const uint8_t *buf, int64_t n, int nthreads) {
    read_args a = {.buf = buf, .n = n};
    if (nthreads > 256) nthreads = 256;
    rp_parallel(read_task, &a, nthreads);
    uint64_t acc = 0;
    for (int i = 0; i < nthreads; i++) acc |= a.part[i];
    return acc;
}
