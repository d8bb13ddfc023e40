// The block scheduler: run fibers round-robin, each until it blocks in a barrier
// or a warp collective, and complete a barrier when its last member arrives.
//
// A barrier is complete when every thread that has not exited has arrived
// (__syncthreads), or when every lane named in the mask has arrived (warp
// collectives). The lane that completes a collective computes every lane's
// result, so a result never depends on which lane ran first. A pass over all
// fibers in which none could run is a deadlock, reported with who waits where.
#include "block.h"

#include <cstdarg>
#include <cstdio>
#include <vector>

namespace rp_sim {

std::string format(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

std::string describe_thread(const Thread& t) {
  return format("thread (%u,%u,%u) [warp %u, lane %u]", t.thread_idx.x, t.thread_idx.y,
                t.thread_idx.z, t.warp, t.lane);
}

static const char* op_name(int op) {
  switch (op) {
    case kOpShfl + kShflIdx: return "__shfl_sync";
    case kOpShfl + kShflUp: return "__shfl_up_sync";
    case kOpShfl + kShflDown: return "__shfl_down_sync";
    case kOpShfl + kShflXor: return "__shfl_xor_sync";
    case kOpVote + kVoteBallot: return "__ballot_sync";
    case kOpVote + kVoteAny: return "__any_sync";
    case kOpVote + kVoteAll: return "__all_sync";
    case kOpVote + kSyncWarp: return "__syncwarp";
    case kOpCollective: return "a WMMA or mma/ldmatrix operation";
    default: return "?";
  }
}

static BlockRun& block_of(Thread* t) { return *static_cast<BlockRun*>(t->block); }

static void yield(Thread* t) { rp_sim_fiber_switch(&t->sp, block_of(t).sched.sp); }

// Ends the block: records why and never returns to the calling fiber.
[[noreturn]] static void fail(Thread* t, const std::string& why) {
  BlockRun& b = block_of(t);
  b.failed = true;
  b.error = describe_thread(*t) + ": " + why;
  rp_sim_fiber_switch(&t->sp, b.sched.sp);
  __builtin_unreachable();
}

static void fiber_main(Thread* t) {
  BlockRun& b = block_of(t);
  b.desc->body(b.desc->closure);
  t->wait = kDone;
  rp_sim_fiber_switch(&t->sp, b.sched.sp);
  __builtin_unreachable();
}

// ---- __syncthreads -----------------------------------------------------------

static void release_block_barrier(BlockRun& b) {
  unsigned count = b.sync_true;
  int result = 0;
  switch (b.sync_kind) {
    case kSyncCount: result = int(count); break;
    case kSyncAnd: result = count == b.arrived; break;
    case kSyncOr: result = count != 0; break;
    default: break;
  }
  for (unsigned i = 0; i < b.nthreads; ++i) {
    if (b.threads[i].wait == kWaitBlock) {
      b.threads[i].wait = kRunnable;
      b.threads[i].out = uint64_t(result);
    }
  }
  b.arrived = 0;
  b.sync_true = 0;
}

// ---- warp collectives ----------------------------------------------------------

static unsigned shfl_source(int kind, unsigned lane, int arg, int width) {
  const unsigned segment = lane & ~unsigned(width - 1);
  switch (kind) {
    case kShflIdx: return segment + (unsigned(arg) & unsigned(width - 1));
    case kShflUp: return (lane - segment) >= unsigned(arg) ? lane - arg : lane;
    case kShflDown: return (lane - segment) + unsigned(arg) < unsigned(width) ? lane + arg : lane;
    case kShflXor: {
      // CUDA: a lane may read an earlier width-group, but not a later one.
      unsigned src = lane ^ unsigned(arg);
      return src >= segment + unsigned(width) ? lane : src;
    }
    default: return lane;
  }
}

static void complete_warp(Thread* t, Warp& w) {
  const unsigned lanes = w.mask;
  if (w.op > kOpShfl && w.op < kOpVote) {
    for (unsigned l = 0; l < 32; ++l) {
      if (!(lanes >> l & 1)) continue;
      Thread* dst = w.lanes[l];
      unsigned src = shfl_source(w.op - kOpShfl, l, dst->arg, w.width);
      if (src >= 32 || !(lanes >> src & 1))
        fail(t, format("%s: lane %u reads lane %u, which is not in the mask 0x%08x", op_name(w.op),
                       l, src, lanes));
      dst->out = w.lanes[src]->in;
    }
  } else if (w.op > kOpVote && w.op < kOpCollective) {
    unsigned ballot = 0;
    for (unsigned l = 0; l < 32; ++l)
      if ((lanes >> l & 1) && w.lanes[l]->in) ballot |= 1u << l;
    uint64_t result = ballot;
    if (w.op == kOpVote + kVoteAny) result = ballot != 0;
    if (w.op == kOpVote + kVoteAll) result = ballot == lanes;
    for (unsigned l = 0; l < 32; ++l)
      if (lanes >> l & 1) w.lanes[l]->out = result;
  } else {
    void* args[32];
    for (unsigned l = 0; l < 32; ++l) args[l] = (lanes >> l & 1) ? w.lanes[l]->lane_arg : nullptr;
    w.fn(args, lanes);
  }
  for (unsigned l = 0; l < 32; ++l)
    if (lanes >> l & 1) w.lanes[l]->wait = kRunnable;
  w.op = kOpNone;
  w.arrived = 0;
}

static void warp_arrive(Thread* t, int op, unsigned mask, int width, CollectiveFn fn) {
  BlockRun& b = block_of(t);
  Warp& w = b.warps[t->warp];
  const unsigned bit = 1u << t->lane;
  mask &= w.exists;
  if (!(mask & bit))
    fail(t, format("%s with mask 0x%08x, which leaves out the calling lane", op_name(op), mask));
  if (mask & ~w.live)
    fail(t, format("%s with mask 0x%08x names lanes 0x%08x that have already exited", op_name(op),
                   mask, mask & ~w.live));
  if (op > kOpShfl && op < kOpVote && (width < 1 || width > 32 || (width & (width - 1))))
    fail(t, format("%s width %d is not a power of two up to 32", op_name(op), width));
  if (w.op == kOpNone) {
    w.op = op;
    w.mask = mask;
    w.width = width;
    w.fn = fn;
  } else if (w.op != op || w.mask != mask || w.width != width || w.fn != fn) {
    fail(t, format("warp %u diverged: this lane calls %s (mask 0x%08x) while lanes 0x%08x wait in "
                   "%s (mask 0x%08x)",
                   t->warp, op_name(op), mask, w.arrived, op_name(w.op), w.mask));
  }
  w.arrived |= bit;
  if (w.arrived == w.mask) {
    complete_warp(t, w);
  } else {
    t->wait = kWaitWarp;
    yield(t);
  }
}

// ---- running a block -------------------------------------------------------------

static std::string ranges(const std::vector<unsigned>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (!s.empty()) s += ",";
    s += j == i ? format("%u", ids[i]) : format("%u-%u", ids[i], ids[j]);
    i = j + 1;
  }
  return s;
}

static std::string deadlock_report(const BlockRun& b) {
  std::vector<unsigned> at_sync;
  for (unsigned i = 0; i < b.nthreads; ++i)
    if (b.threads[i].wait == kWaitBlock) at_sync.push_back(i);
  std::string s = "deadlock: no thread can run.";
  if (!at_sync.empty()) s += " Threads " + ranges(at_sync) + " wait at __syncthreads().";
  for (unsigned wi = 0; wi < b.nwarps; ++wi) {
    const Warp& w = b.warps[wi];
    if (w.op != kOpNone)
      s += format(" Warp %u: lanes 0x%08x wait in %s for mask 0x%08x.", wi, w.arrived,
                  op_name(w.op), w.mask);
  }
  return s + " (A barrier that not every thread reaches, or a collective whose mask names lanes "
             "that call something else?)";
}

static void thread_exited(BlockRun& b, Thread& t) {
  Warp& w = b.warps[t.warp];
  const unsigned bit = 1u << t.lane;
  w.live &= ~bit;
  b.live--;
  if (w.op != kOpNone && (w.mask & bit)) {
    b.failed = true;
    b.error = describe_thread(t) + format(": exited while lanes 0x%08x wait for it in %s",
                                          w.arrived, op_name(w.op));
    return;
  }
  if (b.arrived && b.arrived == b.live) release_block_barrier(b);
}

bool run_block(BlockRun& b, StackSet& stacks) {
  const dim3 bd = b.block_dim;
  b.nthreads = bd.x * bd.y * bd.z;
  b.nwarps = (b.nthreads + 31) / 32;
  b.live = b.nthreads;
  b.arrived = 0;
  b.sync_true = 0;
  b.failed = false;
  scheduler_slot_init(&b.sched);
  for (unsigned wi = 0; wi < b.nwarps; ++wi) {
    Warp& w = b.warps[wi];
    unsigned n = b.nthreads - wi * 32 < 32 ? b.nthreads - wi * 32 : 32;
    w.exists = w.live = n == 32 ? ~0u : (1u << n) - 1;
    w.arrived = w.mask = 0;
    w.op = kOpNone;
  }
  for (unsigned i = 0; i < b.nthreads; ++i) {
    Thread& t = b.threads[i];
    t.thread_idx = uint3{i % bd.x, i / bd.x % bd.y, i / (bd.x * bd.y)};
    t.block = &b;
    t.linear = i;
    t.lane = i % 32;
    t.warp = i / 32;
    t.wait = kRunnable;
    t.cp_async = nullptr;
    b.warps[t.warp].lanes[t.lane] = &t;
    fiber_init(&t, stacks.region(i), &fiber_main);
  }

  unsigned remaining = b.nthreads;
  while (remaining) {
    bool progressed = false;
    for (unsigned i = 0; i < b.nthreads; ++i) {
      Thread& t = b.threads[i];
      if (t.wait != kRunnable) continue;
      b.running = &t;
      rp_sim_fiber_switch(&b.sched.sp, t.sp);
      b.running = nullptr;
      if (b.failed) return false;
      progressed = true;
      if (t.wait == kDone) {
        remaining--;
        thread_exited(b, t);
        if (b.failed) return false;
      }
    }
    if (!progressed) {
      b.error = deadlock_report(b);
      return false;
    }
  }
  return true;
}

}  // namespace rp_sim

using namespace rp_sim;

extern "C" uint64_t rp_sim_shfl(int kind, unsigned mask, uint64_t bits, int lane_arg, int width) {
  Thread* t = self();
  t->in = bits;
  t->arg = lane_arg;
  warp_arrive(t, kOpShfl + kind, mask, width, nullptr);
  return t->out;
}

extern "C" unsigned rp_sim_vote(int kind, unsigned mask, int predicate) {
  Thread* t = self();
  t->in = predicate != 0;
  warp_arrive(t, kOpVote + kind, mask, 32, nullptr);
  return unsigned(t->out);
}

extern "C" void rp_sim_warp_collective(unsigned mask, CollectiveFn fn, void* lane_arg) {
  Thread* t = self();
  t->lane_arg = lane_arg;
  warp_arrive(t, kOpCollective, mask, 32, fn);
}

extern "C" int rp_sim_syncthreads(int kind, int predicate) {
  Thread* t = self();
  BlockRun& b = block_of(t);
  if (b.arrived == 0) b.sync_kind = kind;
  b.arrived++;
  b.sync_true += predicate != 0;
  t->wait = kWaitBlock;
  if (b.arrived == b.live) {
    release_block_barrier(b);
  } else {
    yield(t);
  }
  return int(t->out);
}

extern "C" void rp_sim_trap(const char* why) { fail(self(), why); }
