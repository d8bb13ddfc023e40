// Global-memory traffic counters: what a launch reads from and writes to its
// argument buffers, counted access by access.
//
// A module built for counting (build.py, traffic=True) is compiled with gcc's
// ThreadSanitizer instrumentation: every load and store in the kernel becomes a
// call __tsan_readN(addr) / __tsan_writeN(addr) before the access. These are our own definitions, not the sanitizer runtime's. They look
// the address up among the launch's registered buffers (the kernel's array
// arguments) and count; anything else (fiber stacks, shared memory, the
// simulator's own state) is ignored. Modules built normally call none of this.
//
// Per buffer: bytes and accesses read and written, how many accesses were
// 16-byte vectors, and (from one byte-flag array per direction) how many
// distinct bytes were read and written. Workers run blocks concurrently, so the
// counters are relaxed atomics; one launch counts at a time (traffic_begin ..
// traffic_end, serialized by the launcher).
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

struct Buffer {
  uintptr_t lo = 0, hi = 0;
  std::atomic<uint64_t> bytes[2], accesses[2], vec16[2];  // [0] read, [1] written
  std::vector<uint8_t> touched[2];                         // one flag per byte
};

constexpr int kMaxBuffers = 64;
Buffer g_buffers[kMaxBuffers];
std::atomic<int> g_count{0};  // 0 when not counting: the hooks return at once

inline void count(uintptr_t addr, size_t size, int dir) {
  const int n = g_count.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    Buffer& b = g_buffers[i];
    if (addr < b.lo || addr >= b.hi) continue;
    b.bytes[dir].fetch_add(size, std::memory_order_relaxed);
    b.accesses[dir].fetch_add(1, std::memory_order_relaxed);
    if (size == 16) b.vec16[dir].fetch_add(1, std::memory_order_relaxed);
    uint8_t* flags = b.touched[dir].data() + (addr - b.lo);
    const size_t in_buffer = addr + size <= b.hi ? size : b.hi - addr;
    for (size_t k = 0; k < in_buffer; ++k) __atomic_store_n(flags + k, 1, __ATOMIC_RELAXED);
    return;
  }
}

}  // namespace

// [lo, hi) byte ranges of the launch's buffers; they must not overlap.
extern "C" void rp_sim_traffic_begin(const uintptr_t* lo, const uintptr_t* hi, int n) {
  n = n < kMaxBuffers ? n : kMaxBuffers;
  for (int i = 0; i < n; ++i) {
    Buffer& b = g_buffers[i];
    b.lo = lo[i];
    b.hi = hi[i];
    for (int d = 0; d < 2; ++d) {
      b.bytes[d] = b.accesses[d] = b.vec16[d] = 0;
      b.touched[d].assign(hi[i] - lo[i], 0);
    }
  }
  g_count.store(n, std::memory_order_release);
}

// Stops counting; out[8 i ..] = bytes read, bytes written, read accesses, write
// accesses, 16-byte reads, 16-byte writes, distinct bytes read, distinct bytes
// written, for buffer i.
extern "C" void rp_sim_traffic_end(uint64_t* out) {
  const int n = g_count.exchange(0);
  for (int i = 0; i < n; ++i) {
    Buffer& b = g_buffers[i];
    uint64_t* o = out + 8 * i;
    for (int d = 0; d < 2; ++d) {
      o[d] = b.bytes[d];
      o[2 + d] = b.accesses[d];
      o[4 + d] = b.vec16[d];
      uint64_t distinct = 0;
      for (uint8_t f : b.touched[d]) distinct += f;
      o[6 + d] = distinct;
      std::vector<uint8_t>().swap(b.touched[d]);
    }
  }
}

// ---- the hooks gcc's -fsanitize=thread emits -------------------------------------
#define RP_SIM_HOOKS(N)                                                                   \
  extern "C" void __tsan_read##N(uintptr_t a) { count(a, N, 0); }                         \
  extern "C" void __tsan_write##N(uintptr_t a) { count(a, N, 1); }                        \
  extern "C" void __tsan_unaligned_read##N(uintptr_t a) { count(a, N, 0); }               \
  extern "C" void __tsan_unaligned_write##N(uintptr_t a) { count(a, N, 1); }              \
  extern "C" void __tsan_volatile_read##N(uintptr_t a) { count(a, N, 0); }                \
  extern "C" void __tsan_volatile_write##N(uintptr_t a) { count(a, N, 1); }
RP_SIM_HOOKS(1)
RP_SIM_HOOKS(2)
RP_SIM_HOOKS(4)
RP_SIM_HOOKS(8)
RP_SIM_HOOKS(16)
extern "C" void __tsan_read_range(uintptr_t a, size_t n) { count(a, n, 0); }
extern "C" void __tsan_write_range(uintptr_t a, size_t n) { count(a, n, 1); }
// What an instrumented module's constructor and function prologues expect to find.
extern "C" void __tsan_init() {}
extern "C" void __tsan_func_entry(void*) {}
extern "C" void __tsan_func_exit() {}
