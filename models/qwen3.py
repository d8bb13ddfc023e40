"""Qwen3 (dense): Llama's decoder with an RMSNorm over each head of q and k before
RoPE, and no q/k/v bias (Qwen2 had one). Embeddings tied in the small models."""

from rawpage.models.decoder import DecoderModel


class Qwen3Model(DecoderModel):
    qk_norm = True  # self_attn.q_norm.weight, self_attn.k_norm.weight: (D,)
