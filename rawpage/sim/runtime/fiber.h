// Fibers: one small stack per CUDA thread, and a context switch that saves
// only what the SysV ABI says a callee must preserve.
#pragma once

#include <cstddef>

#include "rp_sim_abi.h"

namespace rp_sim {

// Stacks for up to kMaxThreads fibers, reused from launch to launch. Region i is
//   [header page: Thread*][guard page: PROT_NONE][stack ... grows down]
// so an overflowing fiber faults in its guard page instead of corrupting a
// neighbour, and the fault handler can name the cause.
struct StackSet {
  char* base = nullptr;  // kStackRegion-aligned
  char* mapping = nullptr;
  size_t mapping_bytes = 0;
  char* region(unsigned i) const { return base + i * kStackRegion; }
  bool is_guard_page(const void* addr) const;
};

constexpr unsigned kMaxThreads = 1024;
constexpr size_t kPage = 4096;

StackSet* acquire_stacks();
void release_stacks(StackSet* s);

// The scheduler's end of a switch. With the assembly switch only `sp` is used;
// the ucontext fallback keeps its context in `storage` and points `sp` at it.
struct SchedulerSlot {
  void* sp = nullptr;
  alignas(64) unsigned char storage[2048];
};
void scheduler_slot_init(SchedulerSlot* slot);

// Prepares `t` to start in entry(t) on the stack of `region` at its first switch.
void fiber_init(Thread* t, char* region, void (*entry)(Thread*));

}  // namespace rp_sim

extern "C" void rp_sim_fiber_switch(void** save_sp, void* load_sp);
