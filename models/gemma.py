"""Gemma 2 and Gemma 3 (text). How they differ from Llama:

- RMSNorm scales by (1 + w), not w (folded into w at load);
- the embedding is multiplied by sqrt(dim), and the LM head is tied to it;
- four norms a layer: input, after attention, before and after the MLP;
- GeGLU: gelu (tanh approximation) gates the MLP instead of silu;
- scores are scaled by query_pre_attn_scalar**-0.5 instead of D**-0.5;
- layers alternate sliding-window and global attention (Gemma 2: every other
  layer; Gemma 3: five local to one global, each kind with its own RoPE base);
- Gemma 2 soft-caps attention scores and the final logits: c * tanh(x / c);
- Gemma 3 normalizes each head of q and k, as Qwen3 does (with the 1 + w scale).
"""

from rawpage.models.decoder import DecoderModel


class Gemma2Model(DecoderModel):
    norm_weight_offset = 1.0
    sandwich_norms = True  # post_attention_layernorm, pre_/post_feedforward_layernorm
    scale_embedding = True


class Gemma3Model(Gemma2Model):
    qk_norm = True
