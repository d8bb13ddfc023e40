"""Qwen3-MoE: Qwen3's attention (per-head q/k norms) with a mixture-of-experts MLP
(models/moe.py): mlp.gate routes each token to its top-k experts, each a small
SwiGLU MLP (moe_intermediate_size). Top-k weights renormalized when norm_topk_prob.
Layers listed in mlp_only_layers keep a dense MLP."""

from rawpage.models.qwen3 import Qwen3Model


class Qwen3MoeModel(Qwen3Model):
    def moe_names(self, p: str) -> tuple[str, tuple[str, str, str]]:
        return p + "mlp.", ("gate_proj", "up_proj", "down_proj")
