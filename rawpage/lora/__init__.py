"""Multi-LoRA: PEFT adapters read from disk (adapter.py) and served from device slots
(manager.py); the batched delta itself is an op at the Linear seam (rawpage/ops/lora.py)."""

from rawpage.lora.adapter import LoRAAdapter, LoRAError, LoRANotFoundError, LoRARequest

__all__ = ["LoRAAdapter", "LoRAError", "LoRANotFoundError", "LoRARequest"]
