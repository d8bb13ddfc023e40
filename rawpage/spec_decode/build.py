"""The engine's speculative-decoding hooks, built from `speculative_config`: a SpecDecoder
with the proposer it names, or None when it is off (the engine's step then calls none of
its code)."""

from __future__ import annotations

import logging
from typing import Any

from rawpage.engine_args import EngineArgs
from rawpage.output_processor import OutputProcessor
from rawpage.sampler import Sampler
from rawpage.scheduler import Scheduler
from rawpage.spec_decode.config import SpeculativeConfig
from rawpage.spec_decode.decoder import SpecDecoder
from rawpage.spec_decode.draft_model import DraftModelProposer
from rawpage.spec_decode.ngram import NgramProposer

logger = logging.getLogger("rawpage")


def build_spec_decoder(
    args: EngineArgs,
    draft_model: Any,
    scheduler: Scheduler,
    sampler: Sampler,
    output: OutputProcessor,
) -> SpecDecoder | None:
    """The proposer args.speculative_config names, wired to the engine's parts. draft_model:
    loaded on the engine's backend, and its pool planned, with the target (engine_setup.load_model),
    or None."""
    config: SpeculativeConfig | None = args.speculative_config
    if config is None:
        return None
    limits = scheduler.config
    if config.method == "ngram":
        proposer: Any = NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
    else:
        bm = scheduler.block_manager
        proposer = DraftModelProposer(
            draft_model,
            draft_model.backend,
            bm.block_size,
            bm.num_blocks,
            limits.max_model_len,
            sampler.vocab_size,
            limits.max_num_batched_tokens,
        )
    logger.info(
        "speculative decoding: %s, %d tokens per step%s",
        config.method,
        config.num_speculative_tokens,
        f", lookup {config.prompt_lookup_min}..{config.prompt_lookup_max}" if config.method == "ngram" else "",
    )
    return SpecDecoder(config, proposer, scheduler, sampler, output, limits.max_model_len)
