"""Mistral and Ministral: Llama's decoder with sliding-window attention. Every layer's
query sees only its last `sliding_window` keys (config.sliding_window; none in
Mistral v0.2 and later, so those compute exactly as Llama)."""

from rawpage.models.decoder import DecoderModel


class MistralModel(DecoderModel):
    pass  # the window is config.sliding_window, applied in DecoderModel.forward
