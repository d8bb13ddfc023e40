"""Qwen2.5-VL's image encoder: its ViT and the patch merger, in NumPy on the host (one
image at a time; its GEMMs are BLAS through np.matmul), as transformers'
Qwen2_5_VisionTransformerPretrainedModel computes it.

    patches (S, 3 Tp P P), in m x m merge-group order (image_input.patchify), grid (1, h, w)
      -> @ patch (Conv3d(3, Dv, (Tp, P, P)) as one GEMM) -> (S, Dv)
      -> reorder the merge groups window by window (window_index)
      -> [RMSNorm -> qkv -> 2D RoPE (h, w) on q, k -> attention inside each window, or
          over the whole image in fullatt_block_indexes -> proj -> + ;
          RMSNorm -> down(silu(gate) * up) -> +] x L
      -> RMSNorm -> each merge group's m*m rows side by side (S/m^2, m^2 Dv)
      -> mlp.2(gelu(mlp.0(.))) -> (N, dim) -> back to row-major token order

A window is window_size pixels a side: window_size / P / m merged tokens (112 / 14 / 2 = 4,
so 8 x 8 patches); windows at the right and bottom edges are cut short.

Shapes: S = h * w patches, P = patch size, Tp = temporal patch size, m = merge size,
Dv = vision hidden size, Hv heads of Dh = Dv / Hv, Iv = its MLP size, N = S / m^2
tokens, dim = the text model's hidden size.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from rawpage.backends.base import Backend
from rawpage.models.weight_source import CheckpointWeights, WeightSource
from rawpage.multimodal.vision_config import VisionConfig

SCORES_PER_GROUP = 1 << 24  # float32 attention scores computed at once (64 MiB)


@dataclass
class ViTBlock:
    norm1: np.ndarray  # (Dv,) RMSNorm
    qkv: np.ndarray  # (Dv, 3 Dv) [q | k | v], laid (in, out) for x @ w
    qkv_bias: np.ndarray  # (3 Dv,)
    proj: np.ndarray  # (Dv, Dv)
    proj_bias: np.ndarray  # (Dv,)
    norm2: np.ndarray  # (Dv,)
    gate_up: np.ndarray  # (Dv, 2 Iv) [gate | up]
    gate_up_bias: np.ndarray  # (2 Iv,)
    down: np.ndarray  # (Iv, Dv)
    down_bias: np.ndarray  # (Dv,)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x (n, Dv) / sqrt(mean(x^2) + eps) * w."""
    return x / np.sqrt(np.square(x).mean(axis=-1, keepdims=True) + np.float32(eps)) * w


def gelu_erf(x: np.ndarray) -> np.ndarray:
    """x * Phi(x), torch's nn.GELU(): erf by Abramowitz and Stegun 7.1.26 (error under 1.5e-7)."""
    z = np.abs(x) / np.float32(math.sqrt(2.0))
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = np.sign(x) * (1.0 - poly * np.exp(-z * z))
    return (0.5 * x * (1.0 + erf)).astype(np.float32)


def window_index(gh: int, gw: int, vws: int) -> tuple[np.ndarray, np.ndarray]:
    """The merged-token grid (gh, gw) cut into vws x vws windows (short at the edges):
    (order (N,): the tokens window by window, row-major inside each; lengths (windows,))."""
    grid = np.arange(gh * gw).reshape(gh, gw)
    order, lengths = [], []
    for r in range(0, gh, vws):
        for c in range(0, gw, vws):
            w = grid[r : r + vws, c : c + vws].ravel()
            order.append(w)
            lengths.append(w.size)
    return np.concatenate(order), np.array(lengths)


class Qwen25VisionEncoder:
    """The ViT and merger, weights read from a checkpoint under the Hub's names (visual.*)."""

    def __init__(self, vc: VisionConfig, text_dim: int, backend: Backend, tensors: Mapping | WeightSource) -> None:
        self.vc, self.text_dim, self.backend = vc, text_dim, backend
        source = tensors if isinstance(tensors, WeightSource) else CheckpointWeights(tensors)

        def get(name: str, *shape: int) -> np.ndarray:  # float32 on the host
            return np.asarray(backend.to_numpy(source.load(backend, [(name, shape)])), np.float32)

        Dv, Iv, P, Tp, p = vc.hidden_size, vc.intermediate_size, vc.patch_size, vc.temporal_patch_size, "visual."
        # Conv3d(3, Dv, (Tp, P, P), stride the same, no bias) is one GEMM over flattened patches: (3 Tp P P, Dv)
        self.patch = get(p + "patch_embed.proj.weight", Dv, 3, Tp, P, P).reshape(Dv, -1).T.copy()
        self.blocks = []
        for i in range(vc.num_layers):
            q = f"{p}blocks.{i}."
            mlp = [(q + f"mlp.{n}_proj", Iv) for n in ("gate", "up")]
            self.blocks.append(
                ViTBlock(
                    norm1=get(q + "norm1.weight", Dv),
                    qkv=get(q + "attn.qkv.weight", 3 * Dv, Dv).T.copy(),
                    qkv_bias=get(q + "attn.qkv.bias", 3 * Dv),
                    proj=get(q + "attn.proj.weight", Dv, Dv).T.copy(),
                    proj_bias=get(q + "attn.proj.bias", Dv),
                    norm2=get(q + "norm2.weight", Dv),
                    gate_up=np.concatenate([get(n + ".weight", size, Dv) for n, size in mlp]).T.copy(),
                    gate_up_bias=np.concatenate([get(n + ".bias", size) for n, size in mlp]),
                    down=get(q + "mlp.down_proj.weight", Dv, Iv).T.copy(),
                    down_bias=get(q + "mlp.down_proj.bias", Dv),
                )
            )
        unit = vc.spatial_merge_size**2 * Dv
        self.merger_norm = get(p + "merger.ln_q.weight", Dv)
        self.merger_fc1 = get(p + "merger.mlp.0.weight", unit, unit).T.copy()  # (m^2 Dv, m^2 Dv)
        self.merger_fc1_bias = get(p + "merger.mlp.0.bias", unit)
        self.merger_fc2 = get(p + "merger.mlp.2.weight", text_dim, unit).T.copy()  # (m^2 Dv, dim)
        self.merger_fc2_bias = get(p + "merger.mlp.2.bias", text_dim)
        Dh = Dv // vc.num_heads
        # the 2D rotary's frequencies: Dh/4 for the row, the same Dh/4 for the column
        self.inv_freq = (1.0 / 10000.0 ** (np.arange(0, Dh // 2, 2, dtype=np.float32) / (Dh // 2))).astype(np.float32)

    def num_bytes(self) -> int:
        arrays = [self.patch, self.merger_fc1, self.merger_fc2] + [
            a for b in self.blocks for a in vars(b).values() if isinstance(a, np.ndarray)
        ]
        return sum(a.nbytes for a in arrays)

    def rotary(self, gh: int, gw: int) -> tuple[np.ndarray, np.ndarray]:
        """(cos, sin), each (S, Dh): patch (r, c) turns by r * f in the first quarter of each
        half and c * f in the second, patches in merge-group order."""
        m = self.vc.spatial_merge_size
        rows, cols = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
        group = (gh // m, m, gw // m, m)
        r, c = (a.reshape(group).transpose(0, 2, 1, 3).ravel() for a in (rows, cols))
        angles = np.concatenate([np.outer(r, self.inv_freq), np.outer(c, self.inv_freq)], axis=1).astype(np.float32)
        emb = np.concatenate([angles, angles], axis=1)  # (S, Dh)
        return np.cos(emb), np.sin(emb)

    def encode(self, pixels: np.ndarray, grid: tuple[int, int, int]) -> np.ndarray:
        """An image's patches (S, 3 Tp P P) of grid (t, h, w) -> its soft tokens (N, dim) float32, row-major."""
        vc = self.vc
        t, gh, gw = grid
        m, Dv, Hv = vc.spatial_merge_size, vc.hidden_size, vc.num_heads
        Dh, unit, S = Dv // Hv, m * m, t * gh * gw
        if t != 1:
            raise ValueError("Qwen2.5-VL images have one temporal patch (videos are not supported)")
        self.backend.begin_encoder(S)  # BLAS's threads
        order, lengths = window_index(gh // m, gw // m, vc.window_size // m // vc.patch_size)
        # rows move a merge group (m*m patches) at a time, window by window
        rows = (order[:, None] * unit + np.arange(unit)).ravel()  # (S,)
        x = (pixels @ self.patch)[rows]  # (S, Dv)
        cos, sin = (a[rows][:, None, :] for a in self.rotary(gh, gw))  # (S, 1, Dh)
        windows = np.concatenate([[0], np.cumsum(lengths * unit)])
        whole = np.array([0, S])
        for i, blk in enumerate(self.blocks):
            bounds = whole if i in vc.fullatt_block_indexes else windows
            h = rms_norm(x, blk.norm1, vc.layer_norm_eps) @ blk.qkv + blk.qkv_bias  # (S, 3 Dv)
            q, k, v = (h[:, j * Dv : (j + 1) * Dv].reshape(S, Hv, Dh) for j in range(3))
            q, k = (a * cos + np.concatenate([-a[..., Dh // 2 :], a[..., : Dh // 2]], axis=-1) * sin for a in (q, k))
            o = np.empty((S, Hv, Dh), np.float32)
            for a, b in zip(bounds[:-1], bounds[1:]):  # attention within [a, b), every way
                # heads a group at a time, so that a whole 896-pixel image's scores stay near 64 MiB
                group = max(1, min(Hv, SCORES_PER_GROUP // (b - a) ** 2))
                for h0 in range(0, Hv, group):
                    qs, ks, vs = (z[a:b, h0 : h0 + group].transpose(1, 0, 2) for z in (q, k, v))  # (g, n, Dh)
                    scores = (qs @ ks.transpose(0, 2, 1)) * np.float32(Dh**-0.5)  # (g, n, n)
                    scores -= scores.max(axis=-1, keepdims=True)
                    probs = np.exp(scores)
                    probs /= probs.sum(axis=-1, keepdims=True)
                    o[a:b, h0 : h0 + group] = (probs @ vs).transpose(1, 0, 2)
            x = x + o.reshape(S, Dv) @ blk.proj + blk.proj_bias
            h = rms_norm(x, blk.norm2, vc.layer_norm_eps) @ blk.gate_up + blk.gate_up_bias  # (S, 2 Iv)
            gate, up = np.split(h, 2, axis=-1)
            x = x + (gate / (1.0 + np.exp(-gate)) * up) @ blk.down + blk.down_bias
        # merger: a merge group's m*m patches side by side -> one token of the text model's size
        x = rms_norm(x, self.merger_norm, 1e-6).reshape(S // unit, unit * Dv)
        x = gelu_erf(x @ self.merger_fc1 + self.merger_fc1_bias) @ self.merger_fc2 + self.merger_fc2_bias
        out = np.empty_like(x)
        out[order] = x  # window order -> row-major token order
        return out.astype(np.float32)  # (N, dim)
