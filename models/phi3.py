"""Phi-3 / Phi-3.5: Llama's decoder with q, k, v stored as one tensor (qkv_proj) and
gate and up as one (gate_up_proj, [gate | up]), which is how our GEMMs want them
anyway. Long-context variants use LongRoPE (models/rotary.py); Phi-3-mini-4k has a
2047-token sliding window."""

from rawpage.models.decoder import DecoderModel, Part


class Phi3Model(DecoderModel):
    def attention_parts(self, p: str) -> list[Part]:
        c = self.config
        return [(p + "self_attn.qkv_proj.weight", (c.q_size + 2 * c.kv_size, c.hidden_size))]

    def mlp_parts(self, p: str) -> list[Part]:
        c = self.config
        return [(p + "mlp.gate_up_proj.weight", (2 * c.intermediate_size, c.hidden_size))]
