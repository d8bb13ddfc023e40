"""The vision encoders' kernels (models/siglip.py, models/qwen_vit.py) against their NumPy
references: LayerNorm fused with the residual add (cuda/rms_norm.cu), GELU with and
without the gate and the exact GELU (cuda/activation.cu), and attention over one image's
patches on the prefill kernel (ops/paged_attention.py launch_encoder_attention): whole
(SigLIP, its head size 72 included) and cut into windows of rows (Qwen2.5-VL's, head size 80)."""

import numpy as np
import pytest

from rawpage.ops.layer_ops import (
    fused_add_layer_norm_ref,
    gelu_erf_ref,
    gelu_tanh_and_mul_ref,
    gelu_tanh_ref,
    launch_activation,
    launch_fused_add_layer_norm,
)
from rawpage.ops.paged_attention import encoder_attention_ref, encoder_blocks, launch_encoder_attention
from tests.kernels.conftest import DTYPES, assert_close


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,dim", [(1, 64), (5, 1152), (3, 100), (2, 4096)])
def test_fused_add_layer_norm(device, dtype, T, dim):
    """SigLIP's 1152 (16-byte chunks), dim 100 (element by element), 4096 (two chunks a thread in 16-bit).
    A mean far from zero: the variance must come from (x - mean), not E[x^2] - mean^2."""
    rng = np.random.default_rng(dim)
    x = device.rounded(rng.standard_normal((T, dim)), dtype)
    res = device.rounded(rng.standard_normal((T, dim)) * 2 + 5, dtype)
    w = device.rounded(rng.standard_normal(dim), dtype)
    b = device.rounded(rng.standard_normal(dim), dtype)
    x_dev, res_dev = device.put(x, dtype), device.put(res, dtype)
    normed, new_res = launch_fused_add_layer_norm(
        device.xp, device.loader, x_dev, res_dev, device.put(w, dtype), device.put(b, dtype), 1e-6
    )
    want_normed, want_res = fused_add_layer_norm_ref(x, res, w, b, 1e-6)
    assert_close(device.get(new_res), want_res, dtype, "residual")
    # the normed row is computed from the residual rounded to dtype, as the reference's is
    assert_close(
        device.get(normed), fused_add_layer_norm_ref(np.zeros_like(x), device.get(new_res), w, b, 1e-6)[0], dtype
    )
    assert normed is x_dev and new_res is res_dev  # in place
    if dtype == "float32":
        assert_close(device.get(normed), want_normed, dtype, "normed")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,inter", [(3, 64), (4, 4304), (2, 100)])
def test_gelu_tanh_with_and_without_the_gate(device, dtype, T, inter):
    """SigLIP's MLP width 4304 (16-byte vectors); 100 goes element by element in 16-bit."""
    rng = np.random.default_rng(inter)
    x = device.rounded(rng.standard_normal((T, inter)) * 3, dtype)
    got = launch_activation(device.xp, device.loader, device.put(x, dtype), "gelu_tanh")
    assert_close(device.get(got), device.rounded(gelu_tanh_ref(x), dtype), dtype, "gelu_tanh")
    gated = device.rounded(rng.standard_normal((T, 2 * inter)) * 3, dtype)
    got = launch_activation(device.xp, device.loader, device.put(gated, dtype), "gelu_tanh_and_mul")
    assert_close(device.get(got), gelu_tanh_and_mul_ref(gated), dtype, "gelu_tanh_and_mul")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N,H,D", [(16, 2, 16), (100, 3, 72), (70, 2, 64)])
def test_encoder_attention(device, dtype, N, H, D):
    """Every patch sees every patch; q, k, v as views into one qkv, as the encoder has them.
    D = 72 (SigLIP so400m's heads) has no kernel and is padded to 80."""
    rng = np.random.default_rng(N + D)
    qkv = device.rounded(rng.standard_normal((N, 3 * H * D)), dtype)
    dev = device.put(qkv, dtype)
    q, k, v = (dev[:, i * H * D : (i + 1) * H * D].reshape(N, H, D) for i in range(3))
    got = launch_encoder_attention(device.xp, device.loader, q, k, v, D**-0.5)
    want = encoder_attention_ref(*(qkv[:, i * H * D : (i + 1) * H * D].reshape(N, H, D) for i in range(3)), D**-0.5)
    assert got.shape == (N, H, D)
    assert_close(device.get(got), want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,inter", [(3, 5120), (2, 100)])
def test_gelu_erf(device, dtype, T, inter):
    """Qwen2.5-VL's merger width 5120 (16-byte vectors); 100 goes element by element in 16-bit.
    Wide inputs, so that erf's tails (x Phi(x) -> 0 below, -> x above) are on the line."""
    rng = np.random.default_rng(inter)
    x = device.rounded(rng.standard_normal((T, inter)) * 4, dtype)
    got = launch_activation(device.xp, device.loader, device.put(x, dtype), "gelu_erf")
    assert_close(device.get(got), device.rounded(gelu_erf_ref(x), dtype), dtype, "gelu_erf")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "lens,H,D",
    [
        ([64, 32, 64, 16], 2, 80),  # Qwen2.5-VL's head size; windows cut short at the edges
        ([16, 16, 48, 4, 12], 3, 16),  # a window shorter than a key tile, one of a single merge group
        ([130], 2, 72),  # one sequence, over two query tiles: cu_seqlens [0, N] is the whole image
    ],
)
def test_encoder_attention_in_windows(device, dtype, lens, H, D):
    """Rows cut into sequences by cu_seqlens, each row seeing its own sequence's keys only,
    in one launch. The windows' answer must differ from the whole image's (else a kernel
    that ignores them would pass)."""
    rng = np.random.default_rng(sum(lens) + D)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    N = int(cu[-1])
    qkv = device.rounded(rng.standard_normal((N, 3 * H * D)), dtype)
    dev = device.put(qkv, dtype)
    q, k, v = (dev[:, i * H * D : (i + 1) * H * D].reshape(N, H, D) for i in range(3))
    got = launch_encoder_attention(device.xp, device.loader, q, k, v, D**-0.5, cu)
    host = [qkv[:, i * H * D : (i + 1) * H * D].reshape(N, H, D) for i in range(3)]
    want = encoder_attention_ref(*host, D**-0.5, cu_seqlens=cu)
    for a, b in zip(cu, cu[1:]):  # the reference itself: each window alone is that window's attention
        np.testing.assert_allclose(want[a:b], encoder_attention_ref(*(z[a:b] for z in host), D**-0.5), atol=1e-6)
    assert_close(device.get(got), want, dtype)
    if len(lens) > 1:
        assert np.abs(want - encoder_attention_ref(*host, D**-0.5)).max() > 0.1


def test_encoder_blocks_are_whole_sequences():
    """K and V as a cache of blocks of the gcd of the row starts: each sequence's table lists
    its own rows' blocks, and each row sees up to its sequence's last key."""
    BS, meta = encoder_blocks(40, np.array([0, 16, 24, 40]))
    assert BS == 8
    np.testing.assert_array_equal(meta.block_tables, [[0, 1], [2, 0], [3, 4]])
    np.testing.assert_array_equal(meta.seq_lens, [16, 8, 16])
    np.testing.assert_array_equal(meta.key_end, [15] * 16 + [7] * 8 + [15] * 16)
    assert encoder_blocks(40, None)[0] == 40 and meta.max_query_len == 16
    with pytest.raises(ValueError, match="cu_seqlens must rise from 0 to the 40 rows"):
        encoder_blocks(40, np.array([0, 16, 30]))


def test_layer_norm_says_how_long_a_16_bit_row_may_be(device):
    x = device.xp.zeros((1, 16384), np.float16)
    with pytest.raises(ValueError, match="fused_add_layer_norm supports rows of up to 8192 elements"):
        launch_fused_add_layer_norm(device.xp, device.loader, x, x.copy(), x[0], x[0], 1e-6)
