// The context switch and the fiber stacks.
//
// On x86-64 the switch is twelve instructions: push the six callee-saved
// registers and the SSE/x87 control words, swap stack pointers, pop. ucontext's
// swapcontext also saves the signal mask with a system call, which made it
// 6-12x slower here; it remains as the fallback on other CPUs (and under
// -DRP_SIM_UCONTEXT, to compare).
#include "fiber.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <vector>

#if defined(__x86_64__) && !defined(RP_SIM_UCONTEXT)
#define RP_SIM_ASM_SWITCH 1
#else
#include <ucontext.h>
#endif

#if RP_SIM_ASM_SWITCH
// rp_sim_fiber_switch(save_sp = rdi, load_sp = rsi)
// rp_sim_fiber_entry: first "return" of a new fiber; r12 = Thread*, r13 = entry.
asm(R"(
    .text
    .globl rp_sim_fiber_switch
    .hidden rp_sim_fiber_switch
    .type rp_sim_fiber_switch, @function
rp_sim_fiber_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size rp_sim_fiber_switch, .-rp_sim_fiber_switch

    .globl rp_sim_fiber_entry
    .hidden rp_sim_fiber_entry
    .type rp_sim_fiber_entry, @function
rp_sim_fiber_entry:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size rp_sim_fiber_entry, .-rp_sim_fiber_entry
)");
extern "C" void rp_sim_fiber_entry();
#else
extern "C" void rp_sim_fiber_switch(void** save_sp, void* load_sp) {
  swapcontext(static_cast<ucontext_t*>(*save_sp), static_cast<ucontext_t*>(load_sp));
}
#endif

namespace rp_sim {

bool StackSet::is_guard_page(const void* addr) const {
  auto a = reinterpret_cast<uintptr_t>(addr);
  auto b = reinterpret_cast<uintptr_t>(base);
  if (a < b || a >= b + kMaxThreads * kStackRegion) return false;
  return (a - b) % kStackRegion / kPage == 1;
}

static StackSet* make_stacks() {
  auto* s = new StackSet;
  // One extra region of slack so that the base can be aligned to kStackRegion.
  s->mapping_bytes = (kMaxThreads + 1) * kStackRegion;
  void* m = mmap(nullptr, s->mapping_bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  s->mapping = static_cast<char*>(m);
  auto aligned = (reinterpret_cast<uintptr_t>(m) + kStackRegion - 1) & ~(kStackRegion - 1);
  s->base = reinterpret_cast<char*>(aligned);
  for (unsigned i = 0; i < kMaxThreads; ++i) mprotect(s->region(i) + kPage, kPage, PROT_NONE);
  return s;
}

static std::mutex pool_mutex;
static std::vector<StackSet*> pool;

StackSet* acquire_stacks() {
  std::lock_guard<std::mutex> lock(pool_mutex);
  if (pool.empty()) return make_stacks();
  StackSet* s = pool.back();
  pool.pop_back();
  return s;
}

void release_stacks(StackSet* s) {
  std::lock_guard<std::mutex> lock(pool_mutex);
  pool.push_back(s);
}

void scheduler_slot_init(SchedulerSlot* slot) {
#if RP_SIM_ASM_SWITCH
  slot->sp = nullptr;
#else
  static_assert(sizeof(ucontext_t) <= sizeof(slot->storage), "SchedulerSlot too small");
  slot->sp = slot->storage;
#endif
}

void fiber_init(Thread* t, char* region, void (*entry)(Thread*)) {
  *reinterpret_cast<Thread**>(region) = t;
#if RP_SIM_ASM_SWITCH
  // The frame rp_sim_fiber_switch pops: control words, r15, r14, r13, r12,
  // rbx, rbp, return address. After the ret the stack pointer is the 16-byte
  // aligned top, as the ABI wants it just before a call.
  auto* sp = reinterpret_cast<uint64_t*>(region + kStackRegion - 64);
  uint32_t mxcsr;
  uint16_t fpcw;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpcw));
  sp[0] = mxcsr | (uint64_t(fpcw) << 32);
  sp[1] = 0;
  sp[2] = 0;
  sp[3] = reinterpret_cast<uint64_t>(entry);
  sp[4] = reinterpret_cast<uint64_t>(t);
  sp[5] = 0;
  sp[6] = 0;
  sp[7] = reinterpret_cast<uint64_t>(&rp_sim_fiber_entry);
  t->sp = sp;
#else
  // The ucontext lives in the header page, after the Thread* word.
  auto* uc = reinterpret_cast<ucontext_t*>(region + 64);
  getcontext(uc);
  uc->uc_stack.ss_sp = region + 2 * kPage;
  uc->uc_stack.ss_size = kStackRegion - 2 * kPage;
  uc->uc_link = nullptr;
  makecontext(uc, reinterpret_cast<void (*)()>(entry), 1, t);
  t->sp = uc;
#endif
}

}  // namespace rp_sim
