// What a kernel translation unit (through cuda_sim.h) and the simulator runtime
// (runtime/*.cpp, built once into librpsim) share: the thread and block records,
// and the C entry points of the runtime.
//
// Execution model, in one paragraph: a launch hands blocks to a few OS worker
// threads; a worker runs one block at a time, and every CUDA thread of that
// block is a fiber with its own small stack. Fibers run one after another until
// they reach __syncthreads(), a warp collective (shuffle, vote, WMMA) or their
// end; then the worker's scheduler resumes the next one. So a block's threads
// never run at the same time, and shared memory needs no locking; different
// blocks do run at the same time on different workers, as on a GPU.
#pragma once

#include <cstddef>
#include <cstdint>

struct uint3 {
  unsigned int x, y, z;
};

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

namespace rp_sim {

// Every fiber stack is a region of this size aligned to its size; its first
// word points at the fiber's Thread. So "which CUDA thread am I" is one AND of
// the stack pointer and one load, with no thread-local storage.
constexpr uintptr_t kStackRegion = 128 * 1024;

struct Block;

struct Thread {
  uint3 thread_idx;
  Block* block;
  unsigned linear;  // threadIdx.x + threadIdx.y * blockDim.x + ...
  unsigned lane;    // linear % 32
  unsigned warp;    // linear / 32
  // scheduler state, owned by the runtime
  int wait;                 // rp_sim::Wait
  void* sp;                 // saved stack pointer while switched out
  uint64_t in, out;         // warp collective mailbox: this lane's value, its result
  int arg;                  // shuffle lane argument
  void* lane_arg;           // WMMA collective argument
  void* cp_async;           // ptx_emu.h's pending cp.async copies; nullptr at block start
};

struct Block {
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};

inline Thread* self() {
  // Read the stack pointer itself: deriving it from a local's address would let
  // the compiler treat the load below as a read of that local.
  uintptr_t sp;
#if defined(__x86_64__)
  asm("movq %%rsp, %0" : "=r"(sp));
#else
  sp = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
#endif
  return *reinterpret_cast<Thread* const*>(sp & ~(kStackRegion - 1));
}

// A warp collective whose result the last arriving lane computes for all:
// lane_args[l] is what lane l passed (nullptr for lanes not in `lanes`).
using CollectiveFn = void (*)(void* const* lane_args, unsigned lanes);

enum ShflKind { kShflIdx = 1, kShflUp, kShflDown, kShflXor };
enum VoteKind { kVoteBallot = 1, kVoteAny, kVoteAll, kSyncWarp };
enum SyncKind { kSyncPlain = 0, kSyncCount, kSyncAnd, kSyncOr };

// One launch, as the generated per-kernel entry point describes it.
struct LaunchDesc {
  const char* kernel_name;
  unsigned grid[3];
  unsigned block[3];
  size_t shared_mem;         // dynamic shared memory bytes requested
  size_t shared_capacity;    // bytes the module's extern __shared__ array holds
  int workers;               // OS threads to run blocks on
  int debug;                 // 1: poison dynamic shared memory, check for writes past it
  void (*body)(void* closure);
  void* closure;
  void* (*dynamic_smem)();   // this worker's dynamic shared memory (nullptr if none)
};

}  // namespace rp_sim

extern "C" {
// All return only when the whole warp (or block) has arrived.
uint64_t rp_sim_shfl(int kind, unsigned mask, uint64_t bits, int lane_arg, int width);
unsigned rp_sim_vote(int kind, unsigned mask, int predicate);
void rp_sim_warp_collective(unsigned mask, rp_sim::CollectiveFn fn, void* lane_arg);
int rp_sim_syncthreads(int kind, int predicate);
[[noreturn]] void rp_sim_trap(const char* why);
// 0 on success; otherwise writes a message into err, and the faulting address
// (if the kernel faulted) into *fault_addr.
int rp_sim_launch(const rp_sim::LaunchDesc* desc, char* err, size_t err_len, uintptr_t* fault_addr);
}
