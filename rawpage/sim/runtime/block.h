// One CUDA block on one worker: its fibers, its barrier, its warps.
#pragma once

#include <string>

#include "fiber.h"
#include "rp_sim_abi.h"

namespace rp_sim {

enum Wait { kRunnable = 0, kWaitBlock, kWaitWarp, kDone };

// Warp collectives, as the pending-op code of a Warp.
enum WarpOp {
  kOpNone = 0,
  kOpShfl = 0,     // + ShflKind (1..4)
  kOpVote = 10,    // + VoteKind (1..4)
  kOpCollective = 20,
};

struct Warp {
  unsigned exists;   // lanes that exist (the last warp of a block may be partial)
  unsigned live;     // lanes that exist and have not exited
  unsigned arrived;  // lanes waiting in the pending op
  unsigned mask;     // the pending op's mask, restricted to existing lanes
  int op;            // pending op, kOpNone if none
  int width;         // shuffle width
  CollectiveFn fn;   // kOpCollective: what completes it
  Thread* lanes[32];
};

struct BlockRun : Block {
  const LaunchDesc* desc = nullptr;
  Thread* threads = nullptr;  // kMaxThreads of them, first `nthreads` in use
  unsigned nthreads = 0;
  unsigned nwarps = 0;
  Warp warps[kMaxThreads / 32];
  unsigned live = 0;        // threads that have not exited
  unsigned arrived = 0;     // threads waiting at __syncthreads
  int sync_kind = 0;        // SyncKind of the pending __syncthreads_*
  unsigned sync_true = 0;   // how many arrived with a true predicate
  SchedulerSlot sched;
  Thread* running = nullptr;  // the fiber switched in, for fault reports
  bool failed = false;
  std::string error;
};

// Runs every thread of the block to its end. False on failure, with b.error set.
bool run_block(BlockRun& b, StackSet& stacks);

// Describes the thread running in `b` as "thread (x,y,z)".
std::string describe_thread(const Thread& t);

// printf into a std::string (messages that become Python exceptions); block.cpp.
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace rp_sim
