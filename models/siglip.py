"""Gemma 3's image encoder: a SigLIP vision tower and the average-pool projector, on the
host (one image at a time). Its GEMMs are float32 BLAS through np.matmul; the ops between
them (layer norms, bias + GELU, the softmax) are the backend's VisionOps: the C kernels
of native/vision_ops.c where the CPU backend has them loaded, else the NumPy references
of ops/vision_ops.py, on the backend's threads. Attention runs one head and ATTENTION_ROWS queries at a time, so that its scores
are (4096, G*G) (64 MB at 896 px: one head whole), never (Hv, G*G, G*G) (1 GB).

    pixels (3, S, S) -> P x P patches -> (G*G, Dv) + positions
      -> [LayerNorm -> attention (every patch sees every patch) -> + ;
          LayerNorm -> fc2(gelu(fc1)) -> +] x L -> LayerNorm           (SigLIP)
      -> (G, G, Dv) average-pooled k x k -> (N, Dv) -> RMSNorm(1 + w) -> @ W (Dv, dim)   (projector)

The N = (G/k)^2 rows are the image's soft tokens: they replace the embeddings of its
<image_soft_token> positions in the language model (models/gemma.py).

Shapes: S = image size, P = patch size, G = S / P patches a side, Dv = vision hidden
size, Hv heads of Dv / Hv, Iv = its MLP size, N = tokens per image, dim = text hidden size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from rawpage.backends.base import Backend
from rawpage.models.weight_source import CheckpointWeights, WeightSource
from rawpage.multimodal.vision_config import VisionConfig
from rawpage.ops.vision_ops import VisionOps

ATTENTION_ROWS = 4096  # queries per block of one head's attention scores (measured: 4096 > 2048 > 1024)


@dataclass
class VisionLayer:
    norm1: tuple[np.ndarray, np.ndarray]  # LayerNorm (weight, bias), each (Dv,)
    qkv: np.ndarray  # (Dv, 3 Dv)   [q | k | v], laid (in, out) for x @ w
    qkv_bias: np.ndarray  # (3 Dv,)
    out: np.ndarray  # (Dv, Dv)
    out_bias: np.ndarray  # (Dv,)
    norm2: tuple[np.ndarray, np.ndarray]
    fc1: np.ndarray  # (Dv, Iv)
    fc1_bias: np.ndarray  # (Iv,)
    fc2: np.ndarray  # (Iv, Dv)
    fc2_bias: np.ndarray  # (Dv,)


def attention(ops: VisionOps, qkv: np.ndarray, heads: int) -> np.ndarray:
    """qkv (n, 3 Dv) = [q | k | v] -> every patch attending to every patch, scaled by
    Dh**-0.5, (n, Dv). One head at a time, ATTENTION_ROWS queries at a time: their scores
    against every key (rows, n) in one buffer, softmaxed in place, then times v. (All
    heads at once in blocks of 128 queries, as one batched np.matmul, measured 3-4x the
    CPU time: each small GEMM packs the whole of k again; docs/benchmarks.md.)"""
    n, Dv = qkv.shape[0], qkv.shape[1] // 3
    Dh = Dv // heads
    out = np.empty((n, Dv), np.float32)
    scores = np.empty((min(n, ATTENTION_ROWS), n), np.float32)
    for h in range(heads):
        cols = slice(h * Dh, (h + 1) * Dh)
        q = qkv[:, cols] * np.float32(Dh**-0.5)  # (n, Dh), contiguous
        kT = np.ascontiguousarray(qkv[:, Dv:][:, cols].T)  # (Dh, n)
        v = np.ascontiguousarray(qkv[:, 2 * Dv :][:, cols])  # (n, Dh)
        for r in range(0, n, ATTENTION_ROWS):
            s = scores[: min(ATTENTION_ROWS, n - r)]
            np.matmul(q[r : r + ATTENTION_ROWS], kT, out=s)
            out[r : r + len(s), cols] = ops.softmax(s) @ v
    return out


class Gemma3VisionEncoder:
    """The SigLIP tower and Gemma 3's projector, weights read from a checkpoint under the
    Hub's names (vision_tower.vision_model.*, multi_modal_projector.*)."""

    def __init__(self, vc: VisionConfig, text_dim: int, backend: Backend, tensors: Mapping | WeightSource) -> None:
        self.vc, self.text_dim = vc, text_dim
        self.ops = backend.vision_ops()
        source = tensors if isinstance(tensors, WeightSource) else CheckpointWeights(tensors)

        def get(name: str, *shape: int) -> np.ndarray:  # float32 on the host
            return np.asarray(backend.to_numpy(source.load(backend, [(name, shape)])), np.float32)

        Dv, Iv, P, p = vc.hidden_size, vc.intermediate_size, vc.patch_size, "vision_tower.vision_model."
        # Conv2d(3, Dv, P, stride P) is one GEMM over flattened patches: (3 P P, Dv)
        self.patch = get(p + "embeddings.patch_embedding.weight", Dv, 3, P, P).reshape(Dv, -1).T.copy()
        self.patch_bias = get(p + "embeddings.patch_embedding.bias", Dv)
        self.positions = get(p + "embeddings.position_embedding.weight", vc.patches_per_side**2, Dv)  # (G*G, Dv)
        self.layers = []
        for i in range(vc.num_layers):
            q = f"{p}encoder.layers.{i}."

            def ln(name: str, q: str = q) -> tuple[np.ndarray, np.ndarray]:
                return get(q + name + ".weight", Dv), get(q + name + ".bias", Dv)

            attn = [get(q + f"self_attn.{n}_proj.weight", Dv, Dv) for n in "qkv"]
            self.layers.append(
                VisionLayer(
                    norm1=ln("layer_norm1"),
                    qkv=np.concatenate(attn).T.copy(),
                    qkv_bias=np.concatenate([get(q + f"self_attn.{n}_proj.bias", Dv) for n in "qkv"]),
                    out=get(q + "self_attn.out_proj.weight", Dv, Dv).T.copy(),
                    out_bias=get(q + "self_attn.out_proj.bias", Dv),
                    norm2=ln("layer_norm2"),
                    fc1=get(q + "mlp.fc1.weight", Iv, Dv).T.copy(),
                    fc1_bias=get(q + "mlp.fc1.bias", Iv),
                    fc2=get(q + "mlp.fc2.weight", Dv, Iv).T.copy(),
                    fc2_bias=get(q + "mlp.fc2.bias", Dv),
                )
            )
        self.post_norm = (get(p + "post_layernorm.weight", Dv), get(p + "post_layernorm.bias", Dv))
        m = "multi_modal_projector."
        self.soft_emb_norm = 1.0 + get(m + "mm_soft_emb_norm.weight", Dv)  # Gemma's RMSNorm scales by 1 + w
        self.projection = get(m + "mm_input_projection_weight", Dv, text_dim)  # (Dv, dim), already (in, out)

    def num_bytes(self) -> int:
        arrays = [self.patch, self.positions, self.projection] + [
            a for layer in self.layers for a in vars(layer).values() if isinstance(a, np.ndarray)
        ]
        return sum(a.nbytes for a in arrays)

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        """pixels (3, S, S) float32, normalized -> the image's soft tokens (N, dim) float32."""
        vc, eps, ops = self.vc, self.vc.layer_norm_eps, self.ops
        G, P, Dv = vc.patches_per_side, vc.patch_size, vc.hidden_size
        ops.begin(G * G)
        patches = pixels.reshape(3, G, P, G, P).transpose(1, 3, 0, 2, 4).reshape(G * G, 3 * P * P)
        x = patches @ self.patch + self.patch_bias + self.positions  # (G*G, Dv), patches row by row
        for layer in self.layers:
            h = ops.layer_norm(x, layer.norm1, eps) @ layer.qkv  # (G*G, 3 Dv)
            h += layer.qkv_bias
            x += attention(ops, h, vc.num_heads) @ layer.out
            x += layer.out_bias
            # MLP: fc2(gelu(fc1(x)))
            h = ops.bias_gelu(ops.layer_norm(x, layer.norm2, eps) @ layer.fc1, layer.fc1_bias)  # (G*G, Iv)
            x += h @ layer.fc2
            x += layer.fc2_bias
        x = ops.layer_norm(x, self.post_norm, eps)
        # projector: average k x k neighbouring patches into one token, then RMSNorm and project
        n = round(vc.tokens_per_image**0.5)
        kp = G // n
        pooled = x.reshape(n, kp, n, kp, Dv).mean(axis=(1, 3)).reshape(n * n, Dv)  # (N, Dv)
        normed = pooled / np.sqrt(np.square(pooled).mean(axis=-1, keepdims=True) + np.float32(eps))
        return ((normed * self.soft_emb_norm) @ self.projection).astype(np.float32)  # (N, dim)
