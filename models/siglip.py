"""Gemma 3's image encoder: a SigLIP vision tower and the average-pool projector, one
image at a time, through the backend's ops like the decoder (cpu: NumPy and BLAS; cuda:
our kernels and cuBLAS; sim: the same kernels on the CPU).

    pixels (3, S, S) -> P x P patches -> (G*G, Dv) + positions
      -> [LayerNorm -> attention (every patch sees every patch) -> + ;
          LayerNorm -> fc2(gelu(fc1)) -> +] x L -> LayerNorm           (SigLIP)
      -> (G, G, Dv) average-pooled k x k -> (N, Dv) -> RMSNorm(1 + w) -> @ W (Dv, dim)   (projector)

As in the decoder, each LayerNorm adds the residual stream first (fused_add_layer_norm):
the first adds the position embeddings to the patch embeddings, every later one the
output of the attention or MLP block before it.

The N = (G/k)^2 rows are the image's soft tokens: they replace the embeddings of its
<image_soft_token> positions in the language model (models/gemma.py).

Shapes: S = image size, P = patch size, G = S / P patches a side, Dv = vision hidden
size, Hv heads of Dv / Hv, Iv = its MLP size, N = tokens per image, dim = text hidden size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from rawpage.backends.base import Array, Backend
from rawpage.dtypes import from_float32, to_float32
from rawpage.models.weight_source import TowerWeights, WeightSource
from rawpage.multimodal.vision_config import VisionConfig


@dataclass
class VisionLayer:
    norm1: tuple[Array, Array]  # LayerNorm (weight, bias), each (Dv,)
    qkv: Array  # (3 Dv, Dv)   [q | k | v] rows, a Linear weight (out, in)
    qkv_bias: Array  # (3 Dv,)
    out: Array  # (Dv, Dv)
    out_bias: Array  # (Dv,)
    norm2: tuple[Array, Array]
    fc1: Array  # (Iv, Dv)
    fc1_bias: Array  # (Iv,)
    fc2: Array  # (Dv, Iv)
    fc2_bias: Array  # (Dv,)


class Gemma3VisionEncoder:
    """The SigLIP tower and Gemma 3's projector, weights read from a checkpoint under the
    Hub's names (vision_tower.vision_model.*, multi_modal_projector.*), held by the backend
    in the model's dtype."""

    def __init__(self, vc: VisionConfig, text_dim: int, backend: Backend, tensors: Mapping | WeightSource) -> None:
        self.vc, self.text_dim, self.backend = vc, text_dim, backend
        weights = TowerWeights(backend, tensors)
        host, vector, linear = weights.host, weights.vector, weights.linear
        Dv, Iv, P, p = vc.hidden_size, vc.intermediate_size, vc.patch_size, "vision_tower.vision_model."
        # Conv2d(3, Dv, P, stride P) is one GEMM over flattened patches: (Dv, 3 P P)
        self.patch = linear(host(p + "embeddings.patch_embedding.weight", Dv, 3, P, P).reshape(Dv, -1))
        self.patch_bias = vector(p + "embeddings.patch_embedding.bias", Dv)
        self.positions = vector(p + "embeddings.position_embedding.weight", vc.patches_per_side**2, Dv)  # (G*G, Dv)
        self.layers = []
        for i in range(vc.num_layers):
            q = f"{p}encoder.layers.{i}."

            def ln(name: str, q: str = q) -> tuple[Array, Array]:
                return vector(q + name + ".weight", Dv), vector(q + name + ".bias", Dv)

            self.layers.append(
                VisionLayer(
                    norm1=ln("layer_norm1"),
                    qkv=linear(np.concatenate([host(q + f"self_attn.{n}_proj.weight", Dv, Dv) for n in "qkv"])),
                    qkv_bias=backend.asarray(np.concatenate([host(q + f"self_attn.{n}_proj.bias", Dv) for n in "qkv"])),
                    out=linear(host(q + "self_attn.out_proj.weight", Dv, Dv)),
                    out_bias=vector(q + "self_attn.out_proj.bias", Dv),
                    norm2=ln("layer_norm2"),
                    fc1=linear(host(q + "mlp.fc1.weight", Iv, Dv)),
                    fc1_bias=vector(q + "mlp.fc1.bias", Iv),
                    fc2=linear(host(q + "mlp.fc2.weight", Dv, Iv)),
                    fc2_bias=vector(q + "mlp.fc2.bias", Dv),
                )
            )
        self.post_norm = (vector(p + "post_layernorm.weight", Dv), vector(p + "post_layernorm.bias", Dv))
        m = "multi_modal_projector."
        self.soft_emb_norm = backend.asarray(1.0 + host(m + "mm_soft_emb_norm.weight", Dv))  # Gemma's RMSNorm: 1 + w
        self.projection = linear(host(m + "mm_input_projection_weight", Dv, text_dim).T)  # stored (in, out): (dim, Dv)

    def num_bytes(self) -> int:
        arrays = [self.patch, self.positions, self.projection] + [
            a for layer in self.layers for a in vars(layer).values() if hasattr(a, "nbytes")
        ]
        return sum(int(a.nbytes) for a in arrays)

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        """pixels (3, S, S) float32, normalized -> the image's soft tokens (N, dim) float32, on the host."""
        b, vc, eps = self.backend, self.vc, self.vc.layer_norm_eps
        G, P, Dv, Hv = vc.patches_per_side, vc.patch_size, vc.hidden_size, vc.num_heads
        GG, Dh = G * G, Dv // Hv
        b.begin_encoder(GG)
        patches = pixels.reshape(3, G, P, G, P).transpose(1, 3, 0, 2, 4).reshape(GG, 3 * P * P)  # row by row
        residual = b.linear(b.asarray(patches), self.patch, self.patch_bias)  # (G*G, Dv)
        h = self.positions.copy()  # added to the residual stream by the first norm
        for layer in self.layers:
            # attention: every patch attends to every patch, scaled by Dh**-0.5
            x, residual = b.fused_add_layer_norm(h, residual, *layer.norm1, eps)
            qkv = b.linear(x, layer.qkv, layer.qkv_bias)  # (G*G, 3 Dv)
            q, k, v = (qkv[:, i * Dv : (i + 1) * Dv].reshape(GG, Hv, Dh) for i in range(3))
            o = b.encoder_attention(q, k, v, Dh**-0.5)  # (G*G, Hv, Dh)
            h = b.linear(o.reshape(GG, Dv), layer.out, layer.out_bias)
            # MLP: fc2(gelu(fc1(x)))
            x, residual = b.fused_add_layer_norm(h, residual, *layer.norm2, eps)
            h = b.linear(b.gelu_tanh(b.linear(x, layer.fc1, layer.fc1_bias)), layer.fc2, layer.fc2_bias)
        x, _ = b.fused_add_layer_norm(h, residual, *self.post_norm, eps)  # (G*G, Dv)
        # projector: average k x k neighbouring patches into one token (array arithmetic in
        # float32: one pass over (G*G, Dv)), then RMSNorm(1 + w) and project
        n = round(vc.tokens_per_image**0.5)
        kp = G // n
        pooled = to_float32(x).reshape(n, kp, n, kp, Dv).mean(axis=(1, 3)).reshape(n * n, Dv)  # (N, Dv)
        normed = b.rms_norm(from_float32(pooled, x.dtype), self.soft_emb_norm, eps)
        return np.asarray(b.to_numpy(b.linear(normed, self.projection)), np.float32)  # (N, dim)
