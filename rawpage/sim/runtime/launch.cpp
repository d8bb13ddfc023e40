// A launch: check the configuration as the CUDA driver would, hand the blocks to
// worker threads, turn faults inside kernels into errors, and report the first.
//
// Faults: a SIGSEGV or SIGBUS on a worker while it runs a block jumps back to
// that worker's loop (siglongjmp) and fails the launch with the faulting thread
// and address, instead of killing the Python process. The handler runs on an
// alternate stack so that a fiber that overflowed its own stack is reported too.
// A fault anywhere else goes to the handler that was installed before ours.
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "block.h"

namespace rp_sim {

struct Worker {
  pthread_t tid;
  sigjmp_buf jmp;
  volatile sig_atomic_t in_kernel = 0;
  void* volatile fault_addr = nullptr;
  volatile int fault_signal = 0;
};

constexpr int kMaxWorkers = 64;
static std::atomic<Worker*> g_workers[kMaxWorkers];
static struct sigaction g_prev_segv, g_prev_bus;
static std::mutex g_install_mutex;

static void on_fault(int sig, siginfo_t* info, void*) {
  pthread_t me = pthread_self();
  for (auto& slot : g_workers) {
    Worker* w = slot.load(std::memory_order_relaxed);
    if (w && pthread_equal(w->tid, me) && w->in_kernel) {
      w->fault_addr = info->si_addr;
      w->fault_signal = sig;
      w->in_kernel = 0;
      siglongjmp(w->jmp, 1);
    }
  }
  // Not ours: put back the previous handler; the instruction faults again into it.
  sigaction(sig, sig == SIGSEGV ? &g_prev_segv : &g_prev_bus, nullptr);
}

static void install_fault_handlers() {
  std::lock_guard<std::mutex> lock(g_install_mutex);
  for (int sig : {SIGSEGV, SIGBUS}) {
    struct sigaction cur;
    sigaction(sig, nullptr, &cur);
    if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_fault) continue;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, sig == SIGSEGV ? &g_prev_segv : &g_prev_bus);
  }
}

struct Launch {
  const LaunchDesc* desc;
  unsigned long nblocks;
  std::atomic<unsigned long> next{0};
  std::atomic<bool> failed{false};
  std::mutex mutex;
  std::string error;
  uintptr_t fault_addr = 0;

  void fail(const std::string& why, uintptr_t addr = 0) {
    std::lock_guard<std::mutex> lock(mutex);
    if (error.empty()) {
      error = why;
      fault_addr = addr;
    }
    failed = true;
  }
};

// Debug mode: dynamic shared memory starts as 0xFF bytes (NaN in every float
// type), and the bytes just past the launch's shared_mem must still be 0xFF
// when the block ends.
static size_t smem_guard_bytes(const LaunchDesc& d) {
  return std::min<size_t>(d.shared_capacity - d.shared_mem, 4096);
}

static void run_blocks(Launch* L, Worker* w, BlockRun* b, StackSet* stacks, unsigned char* smem) {
  const LaunchDesc& d = *L->desc;
  const unsigned gx = d.grid[0], gy = d.grid[1];
  while (!L->failed) {
    const unsigned long i = L->next.fetch_add(1);
    if (i >= L->nblocks) return;
    b->block_idx = uint3{unsigned(i % gx), unsigned(i / gx % gy), unsigned(i / (gx * gy))};
    const std::string where = format("%s, block (%u,%u,%u)", d.kernel_name, b->block_idx.x,
                                     b->block_idx.y, b->block_idx.z);
    if (d.debug && smem) memset(smem, 0xFF, d.shared_mem + smem_guard_bytes(d));
    if (sigsetjmp(w->jmp, 1) == 0) {
      w->in_kernel = 1;
      const bool ok = run_block(*b, *stacks);
      w->in_kernel = 0;
      if (!ok) return L->fail(where + ", " + b->error);
    } else {
      const void* addr = w->fault_addr;
      std::string who = b->running ? describe_thread(*b->running) : std::string("the scheduler");
      std::string what =
          stacks->is_guard_page(addr)
              ? format("stack overflow: a thread used more than its %zu KiB fiber stack",
                       size_t(kStackRegion - 2 * kPage) / 1024)
              : format("%s at address %p", w->fault_signal == SIGBUS ? "bus error"
                                                                      : "segmentation fault",
                       addr);
      return L->fail(where + ", " + who + ": " + what, reinterpret_cast<uintptr_t>(addr));
    }
    if (d.debug && smem) {
      const size_t end = d.shared_mem + smem_guard_bytes(d);
      for (size_t k = d.shared_mem; k < end; ++k) {
        if (smem[k] != 0xFF)
          return L->fail(where + format(": wrote past the end of its %zu bytes of dynamic shared "
                                        "memory (byte %zu was changed)",
                                        d.shared_mem, k));
      }
    }
  }
}

static void worker_main(Launch* L) {
  auto w = std::make_unique<Worker>();
  w->tid = pthread_self();
  int slot = -1;
  for (int i = 0; i < kMaxWorkers && slot < 0; ++i) {
    Worker* expected = nullptr;
    if (g_workers[i].compare_exchange_strong(expected, w.get())) slot = i;
  }
  std::vector<char> alt(64 * 1024);
  stack_t ss, old_ss;
  ss.ss_sp = alt.data();
  ss.ss_size = alt.size();
  ss.ss_flags = 0;
  sigaltstack(&ss, &old_ss);

  StackSet* stacks = nullptr;
  try {
    stacks = acquire_stacks();
    auto b = std::make_unique<BlockRun>();
    std::vector<Thread> threads(kMaxThreads);
    b->threads = threads.data();
    b->desc = L->desc;
    b->block_dim = dim3(L->desc->block[0], L->desc->block[1], L->desc->block[2]);
    b->grid_dim = dim3(L->desc->grid[0], L->desc->grid[1], L->desc->grid[2]);
    auto* smem = static_cast<unsigned char*>(L->desc->dynamic_smem ? L->desc->dynamic_smem()
                                                                   : nullptr);
    run_blocks(L, w.get(), b.get(), stacks, smem);
  } catch (const std::exception& e) {
    L->fail(std::string("simulator ran out of memory: ") + e.what());
  }
  if (stacks) release_stacks(stacks);
  ss.ss_flags = SS_DISABLE;
  sigaltstack(old_ss.ss_flags & SS_DISABLE ? &ss : &old_ss, nullptr);
  if (slot >= 0) g_workers[slot] = nullptr;
}

static std::string check_config(const LaunchDesc& d) {
  const unsigned* g = d.grid;
  const unsigned* b = d.block;
  const unsigned long threads = 1ul * b[0] * b[1] * b[2];
  if (!g[0] || !g[1] || !g[2] || !b[0] || !b[1] || !b[2])
    return format("invalid configuration: grid (%u,%u,%u), block (%u,%u,%u) has a zero", g[0],
                  g[1], g[2], b[0], b[1], b[2]);
  if (threads > kMaxThreads || b[0] > 1024 || b[1] > 1024 || b[2] > 64)
    return format("invalid configuration: block (%u,%u,%u) is over CUDA's limits (1024 threads, "
                  "z at most 64)",
                  b[0], b[1], b[2]);
  if (g[0] > 0x7fffffffu || g[1] > 65535 || g[2] > 65535)
    return format("invalid configuration: grid (%u,%u,%u) is over CUDA's limits (2^31-1, 65535, "
                  "65535)",
                  g[0], g[1], g[2]);
  if (d.dynamic_smem && d.shared_mem > d.shared_capacity)
    return format("asks for %zu bytes of dynamic shared memory; the simulator, like sm_90, gives "
                  "at most %zu",
                  d.shared_mem, d.shared_capacity);
  return "";
}

}  // namespace rp_sim

using namespace rp_sim;

extern "C" int rp_sim_launch(const LaunchDesc* d, char* err, size_t err_len,
                             uintptr_t* fault_addr) {
  std::string bad = check_config(*d);
  if (!bad.empty()) {
    snprintf(err, err_len, "%s: %s", d->kernel_name, bad.c_str());
    return 1;
  }
  install_fault_handlers();
  Launch L;
  L.desc = d;
  L.nblocks = 1ul * d->grid[0] * d->grid[1] * d->grid[2];
  const unsigned long workers = std::clamp<unsigned long>(d->workers, 1, kMaxWorkers);
  std::vector<std::thread> pool;
  for (unsigned long i = 0; i < std::min(workers, L.nblocks); ++i)
    pool.emplace_back(worker_main, &L);
  for (auto& t : pool) t.join();
  if (L.error.empty()) return 0;
  snprintf(err, err_len, "%s", L.error.c_str());
  if (fault_addr) *fault_addr = L.fault_addr;
  return 1;
}

// Debug mode's argument buffers: `bytes` placed so that they end (rounded up to
// 16 for alignment) right before a PROT_NONE page, with another before them.
extern "C" void* rp_sim_guarded_alloc(size_t bytes) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  const size_t data = (bytes + 15) / 16 * 16;
  const size_t data_pages = (data + page - 1) / page;
  const size_t total = (data_pages + 2) * page;
  void* m = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  char* base = static_cast<char*>(m);
  mprotect(base, page, PROT_NONE);
  mprotect(base + (data_pages + 1) * page, page, PROT_NONE);
  return base + (data_pages + 1) * page - data;
}

extern "C" void rp_sim_guarded_free(void* p, size_t bytes) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  const size_t data = (bytes + 15) / 16 * 16;
  const size_t data_pages = (data + page - 1) / page;
  char* end = static_cast<char*>(p) + data;  // start of the trailing guard page
  munmap(end - (data_pages + 1) * page, (data_pages + 2) * page);
}
