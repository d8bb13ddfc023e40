"""The --max-loras rule the scheduler applies: at most that many adapters among the running
sequences, so that every step's adapters fit the device slots (rawpage/lora/manager.py).

A leaf: the scheduler reads it without importing the LoRA manager, its ops and the loader."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rawpage.sequence import Sequence


def lora_fits(seq: Sequence, running: Seq[Sequence], max_loras: int) -> bool:
    """A sequence may join the running ones if its adapter is among theirs, or if they use
    fewer than --max-loras adapters (0: LoRA off, no rule)."""
    lora = seq.request.lora
    if lora is None or not max_loras:
        return True
    active = {id(s.request.lora) for s in running if s.request.lora is not None}
    return id(lora) in active or len(active) < max_loras
