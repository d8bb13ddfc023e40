"""The engine's speculative-decoding hooks, built from `speculative_config`: a SpecDecoder
with the proposer it names, or NoSpeculation (each hook does nothing) when it is off."""

from __future__ import annotations

import logging
from typing import Any

from rawpage.device_logits import DeviceLogits
from rawpage.scheduler import SchedulerOutput
from rawpage.sequence import Sequence
from rawpage.spec_decode.config import SpeculativeConfig
from rawpage.spec_decode.decoder import SpecDecoder
from rawpage.spec_decode.draft_model import DraftModelProposer
from rawpage.spec_decode.ngram import NgramProposer

logger = logging.getLogger("rawpage")


class NoSpeculation:
    """The engine's hooks when speculative decoding is off: every step decodes one token."""

    stats = None

    def propose(self, running: list[Sequence]) -> None:
        pass

    def settle(self, sched: SchedulerOutput) -> None:
        pass

    def verify(self, logits: DeviceLogits, ready: list[tuple[Sequence, int]]) -> tuple[list[tuple[Sequence, int]], int]:
        return ready, 0


def build_spec_decoder(engine: Any) -> SpecDecoder | NoSpeculation:
    """From engine.args.speculative_config: the proposer it names, wired to the engine's parts."""
    config: SpeculativeConfig | None = engine.args.speculative_config
    if config is None:
        return NoSpeculation()
    if config.method == "ngram":
        proposer: Any = NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
    else:
        bm = engine.block_manager
        c = engine.model_config
        proposer = DraftModelProposer(
            engine.draft_model,  # loaded, and its pool planned, with the target (engine_setup.load_model)
            engine.backend,
            bm.block_size,
            bm.num_blocks,
            engine.max_model_len,
            c.vocab_size,
            engine.scheduler.config.max_num_batched_tokens,
        )
    logger.info(
        "speculative decoding: %s, %d tokens per step%s",
        config.method,
        config.num_speculative_tokens,
        f", lookup {config.prompt_lookup_min}..{config.prompt_lookup_max}" if config.method == "ngram" else "",
    )
    return SpecDecoder(
        config, proposer, engine.scheduler, engine.sampler, engine.output, engine.max_model_len, engine._fail_seq
    )
