"""Qwen2.5-VL's image encoder: its ViT and the patch merger, one image at a time, through
the backend's ops like the decoder (cpu: our C kernels and BLAS, or the NumPy
references; cuda: our kernels and cuBLAS; sim: the same kernels on the CPU), as
transformers' Qwen2_5_VisionTransformerPretrainedModel computes it.

    patches (S, 3 Tp P P), in m x m merge-group order (image_input.patchify), grid (1, h, w)
      -> reorder the merge groups window by window (window_index), on the host
      -> @ patch (Conv3d(3, Dv, (Tp, P, P)) as one GEMM) -> (S, Dv)
      -> [RMSNorm -> qkv -> 2D RoPE (h, w) on q, k -> attention inside each window, or
          over the whole image in fullatt_block_indexes -> proj -> + ;
          RMSNorm -> down(silu(gate) * up) -> +] x L
      -> RMSNorm -> each merge group's m*m rows side by side (S/m^2, m^2 Dv)
      -> mlp.2(gelu(mlp.0(.))) -> (N, dim) -> back to row-major token order, on the host

As in the decoder, each RMSNorm adds the residual stream first (fused_add_rms_norm): the
first adds nothing, every later one the output of the attention or MLP block before it.

A window is window_size pixels a side: window_size / P / m merged tokens (112 / 14 / 2 = 4,
so 8 x 8 patches); windows at the right and bottom edges are cut short. After the
reordering each window is a run of rows, so a layer's attention is one call over the
image with the windows' row starts (cu_seqlens, as flash-attention's varlen calls take
them in transformers); a full-attention layer's is the whole image.

The rotary: patch (r, c) turns by r * f in the first quarter of each half of a head and
by c * f in the second (emb = [angles | angles], rotate_half: NeoX style). That is
backend.rope with is_neox, each row its own position (arange(S)) and a per-image table
whose row i is [cos | sin] of row i's angles (S, Dh/2) = [r_i * inv_freq | c_i * inv_freq].

Shapes: S = h * w patches, P = patch size, Tp = temporal patch size, m = merge size,
Dv = vision hidden size, Hv heads of Dh = Dv / Hv, Iv = its MLP size, N = S / m^2
tokens, dim = the text model's hidden size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from rawpage.backends.base import Array, Backend
from rawpage.models.weight_source import TowerWeights, WeightSource
from rawpage.multimodal.vision_config import VisionConfig


@dataclass
class ViTBlock:
    norm1: Array  # (Dv,) RMSNorm
    qkv: Array  # (3 Dv, Dv) [q | k | v] rows, a Linear weight (out, in)
    qkv_bias: Array  # (3 Dv,)
    proj: Array  # (Dv, Dv)
    proj_bias: Array  # (Dv,)
    norm2: Array  # (Dv,)
    gate_up: Array  # (2 Iv, Dv) [gate | up] rows
    gate_up_bias: Array  # (2 Iv,)
    down: Array  # (Dv, Iv)
    down_bias: Array  # (Dv,)


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
    """The ViT and merger, weights read from a checkpoint under the Hub's names (visual.*),
    held by the backend in the model's dtype."""

    def __init__(self, vc: VisionConfig, text_dim: int, backend: Backend, tensors: Mapping | WeightSource) -> None:
        self.vc, self.text_dim, self.backend = vc, text_dim, backend
        weights = TowerWeights(backend, tensors)
        host, vector, linear = weights.host, weights.vector, weights.linear
        Dv, Iv, P, Tp, p = vc.hidden_size, vc.intermediate_size, vc.patch_size, vc.temporal_patch_size, "visual."
        # Conv3d(3, Dv, (Tp, P, P), stride the same, no bias) is one GEMM over flattened patches: (Dv, 3 Tp P P)
        self.patch = linear(host(p + "patch_embed.proj.weight", Dv, 3, Tp, P, P).reshape(Dv, -1))
        self.blocks = []
        for i in range(vc.num_layers):
            q = f"{p}blocks.{i}."
            mlp = [(q + f"mlp.{n}_proj", Iv) for n in ("gate", "up")]
            self.blocks.append(
                ViTBlock(
                    norm1=vector(q + "norm1.weight", Dv),
                    qkv=linear(host(q + "attn.qkv.weight", 3 * Dv, Dv)),
                    qkv_bias=vector(q + "attn.qkv.bias", 3 * Dv),
                    proj=linear(host(q + "attn.proj.weight", Dv, Dv)),
                    proj_bias=vector(q + "attn.proj.bias", Dv),
                    norm2=vector(q + "norm2.weight", Dv),
                    gate_up=linear(np.concatenate([host(n + ".weight", size, Dv) for n, size in mlp])),
                    gate_up_bias=backend.asarray(np.concatenate([host(n + ".bias", size) for n, size in mlp])),
                    down=linear(host(q + "mlp.down_proj.weight", Dv, Iv)),
                    down_bias=vector(q + "mlp.down_proj.bias", Dv),
                )
            )
        unit = vc.spatial_merge_size**2 * Dv
        self.merger_norm = vector(p + "merger.ln_q.weight", Dv)
        self.merger_fc1 = linear(host(p + "merger.mlp.0.weight", unit, unit))  # (m^2 Dv, m^2 Dv)
        self.merger_fc1_bias = vector(p + "merger.mlp.0.bias", unit)
        self.merger_fc2 = linear(host(p + "merger.mlp.2.weight", text_dim, unit))  # (dim, m^2 Dv)
        self.merger_fc2_bias = vector(p + "merger.mlp.2.bias", text_dim)
        Dh = Dv // vc.num_heads
        # the 2D rotary's frequencies: Dh/4 for the row, the same Dh/4 for the column
        self.inv_freq = (1.0 / 10000.0 ** (np.arange(0, Dh // 2, 2, dtype=np.float32) / (Dh // 2))).astype(np.float32)

    def num_bytes(self) -> int:
        arrays = [self.patch, self.merger_fc1, self.merger_fc2] + [
            a for b in self.blocks for a in vars(b).values() if hasattr(a, "nbytes")
        ]
        return sum(int(a.nbytes) for a in arrays)

    def rotary(self, gh: int, gw: int, rows: np.ndarray) -> np.ndarray:
        """The rope table (S, Dh) float32 of a (gh, gw) patch grid: row i is [cos | sin] of
        patch rows[i]'s angles [r * f | c * f] (S, Dh/2), patches in merge-group order."""
        m = self.vc.spatial_merge_size
        r, c = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
        group = (gh // m, m, gw // m, m)
        r, c = (a.reshape(group).transpose(0, 2, 1, 3).ravel()[rows] for a in (r, c))
        angles = np.concatenate([np.outer(r, self.inv_freq), np.outer(c, self.inv_freq)], axis=1)  # (S, Dh/2)
        return np.concatenate([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)

    def encode(self, pixels: np.ndarray, grid: tuple[int, int, int]) -> np.ndarray:
        """An image's patches (S, 3 Tp P P) of grid (t, h, w) -> its soft tokens (N, dim) float32, row-major."""
        b, vc, eps = self.backend, self.vc, self.vc.layer_norm_eps
        t, gh, gw = grid
        m, Dv, Hv = vc.spatial_merge_size, vc.hidden_size, vc.num_heads
        Dh, unit, S = Dv // Hv, m * m, t * gh * gw
        if t != 1:
            raise ValueError("Qwen2.5-VL images have one temporal patch (videos are not supported)")
        b.begin_encoder(S)
        order, lengths = window_index(gh // m, gw // m, vc.window_size // m // vc.patch_size)
        # rows move a merge group (m*m patches) at a time, window by window
        rows = (order[:, None] * unit + np.arange(unit)).ravel()  # (S,)
        windows = np.concatenate([[0], np.cumsum(lengths * unit)])  # (windows + 1,) row starts
        positions = b.asarray(np.arange(S, dtype=np.int32), np.int32)  # row i turns by cos_sin[i]
        cos_sin = b.asarray(self.rotary(gh, gw, rows), np.float32)  # (S, Dh)
        residual = b.linear(b.asarray(pixels[rows]), self.patch)  # (S, Dv)
        h = b.zeros((S, Dv))  # the first norm adds nothing to the residual stream
        for i, blk in enumerate(self.blocks):
            # attention inside each window (or over the whole image), scaled by Dh**-0.5
            x, residual = b.fused_add_rms_norm(h, residual, blk.norm1, eps)
            qkv = b.linear(x, blk.qkv, blk.qkv_bias)  # (S, 3 Dv)
            q, k, v = (qkv[:, j * Dv : (j + 1) * Dv].reshape(S, Hv, Dh) for j in range(3))
            b.rope(positions, q, k, cos_sin, True)
            o = b.encoder_attention(q, k, v, Dh**-0.5, None if i in vc.fullatt_block_indexes else windows)
            h = b.linear(o.reshape(S, Dv), blk.proj, blk.proj_bias)
            # MLP: down(silu(gate) * up)
            x, residual = b.fused_add_rms_norm(h, residual, blk.norm2, eps)
            h = b.linear(b.silu_and_mul(b.linear(x, blk.gate_up, blk.gate_up_bias)), blk.down, blk.down_bias)
        # merger: a merge group's m*m patches side by side -> one token of the text model's size
        x, _ = b.fused_add_rms_norm(h, residual, self.merger_norm, 1e-6)
        x = b.gelu_erf(b.linear(x.reshape(S // unit, unit * Dv), self.merger_fc1, self.merger_fc1_bias))
        tokens = np.asarray(b.to_numpy(b.linear(x, self.merger_fc2, self.merger_fc2_bias)), np.float32)
        return tokens[np.argsort(order)]  # (N, dim): window order -> row-major token order
