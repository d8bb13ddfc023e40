"""Engine statistics: counters the server exports, and a log line every few seconds while busy."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rawpage.kv_usage import KVUsage
    from rawpage.scheduler import Scheduler
    from rawpage.spec_decode.decoder import SpecDecodeStats

logger = logging.getLogger("rawpage")


@dataclass
class StepStats:
    """Gauges after one step."""

    num_running: int
    num_waiting: int
    num_swapped: int
    kv_usage: float  # fraction of blocks in use
    num_prompt_tokens: int  # computed this step (prefill, recompute)
    num_generation_tokens: int  # sampled this step
    num_waiting_deferred: int = 0  # of num_waiting, those let by (over --max-loras, grammar compiling)


@dataclass
class EngineStats:
    log_interval: float = 5.0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    preemptions_total: int = 0
    steps_total: int = 0  # engine iterations that ran a forward pass
    last: StepStats | None = None
    spec: SpecDecodeStats | None = None  # speculative decoding's counters, when it is on
    _window_start: float = field(default_factory=time.monotonic)
    _window_prompt: int = 0
    _window_gen: int = 0
    _last_log: float = field(default_factory=time.monotonic)

    def record_step(self, scheduler: Scheduler, num_prompt_tokens: int, num_generation_tokens: int) -> None:
        """After every step: gauges from the scheduler and its block manager, the token
        counters, and a log line every `log_interval` seconds."""
        sc, bm = scheduler, scheduler.block_manager
        s = StepStats(
            len(sc.running),
            len(sc.waiting),
            len(sc.swapped),
            bm.num_used_blocks / max(1, bm.num_blocks),
            num_prompt_tokens,
            num_generation_tokens,
            sc.num_waiting_deferred,
        )
        self.last = s
        self.steps_total += bool(s.num_prompt_tokens or s.num_generation_tokens)
        self.prompt_tokens_total += s.num_prompt_tokens
        self.generation_tokens_total += s.num_generation_tokens
        self._window_prompt += s.num_prompt_tokens
        self._window_gen += s.num_generation_tokens
        self.preemptions_total = sc.num_preemptions
        now = time.monotonic()
        if self.log_interval and now - self._last_log >= self.log_interval:
            # The block accounting walks every running sequence, so only when a line is due.
            self._log(s, bm.usage(sc.running), bm.prefix_hits / max(1, bm.prefix_queries), now)

    def _log(self, s: StepStats, u: KVUsage, prefix_hit_rate: float, now: float) -> None:
        dt = now - self._window_start
        logger.info(
            "running: %d, waiting: %d, swapped: %d, preemptions: %d, KV cache: %.1f%% (%d blocks, "
            "%d tokens stored, %d slots wasted, %d blocks saved by sharing, %d released by the sliding window), "
            "prefix cache hits: %.1f%%, "
            "prompt: %.1f tok/s, generation: %.1f tok/s",
            s.num_running,
            s.num_waiting,
            s.num_swapped,
            self.preemptions_total,
            100 * s.kv_usage,
            u.blocks_used,
            u.stored_tokens,
            u.waste,
            u.blocks_saved_by_sharing,
            u.blocks_released_by_window,
            100 * prefix_hit_rate,
            self._window_prompt / dt,
            self._window_gen / dt,
        )
        if self.spec is not None and self.spec.num_drafts:
            sp = self.spec
            logger.info(
                "speculative decoding: acceptance rate %.1f%%, mean accepted length %.2f, drafts %d, "
                "drafting %.1f ms per sequence-step",
                100 * sp.acceptance_rate,
                sp.mean_accepted_length,
                sp.num_drafts,
                1e3 * sp.draft_seconds / max(1, sp.num_drafts),
            )
        self._last_log = self._window_start = now
        self._window_prompt = self._window_gen = 0
