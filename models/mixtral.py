"""Mixtral: Mistral's decoder whose MLP is a mixture of experts (models/moe.py):
block_sparse_moe.gate routes each token to the top 2 of 8 experts, whose gate,
up and down projections are named w1, w3 and w2. Top-k weights always renormalized."""

from rawpage.models.decoder import DecoderModel


class MixtralModel(DecoderModel):
    def moe_names(self, p: str) -> tuple[str, tuple[str, str, str]]:
        return p + "block_sparse_moe.", ("w1", "w3", "w2")
