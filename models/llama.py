"""Llama (Llama 2/3, SmolLM) and Qwen2: the plain pre-norm decoder of models/decoder.py,
with SwiGLU, RoPE (Llama 3's frequency scaling from the config, or as GGUF's
`rope_freqs` divisors), and Qwen2's q/k/v bias (config.attention_bias)."""

from rawpage.models.decoder import DecoderModel


class LlamaModel(DecoderModel):
    pass  # every difference of the other families is off by default in DecoderModel
