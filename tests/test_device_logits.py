"""Logits left on the device: rows come back only when asked, and a batch of plain
greedy sequences is argmaxed where the logits are, with the sampler's answer."""

import numpy as np
import pytest

from rawpage.backends import get_backend
from rawpage.device_logits import DeviceLogits
from rawpage.dtypes import bf16_from_f32
from rawpage.sampler import Sampler
from rawpage.sampling_params import SamplingParams
from tests.test_sampler import EOS, V, seq_with


class CountingLogits(DeviceLogits):
    """Counts which path the sampler took."""

    def __init__(self, *a):
        super().__init__(*a)
        self.argmaxes = self.fetches = 0

    def argmax(self, rows):
        self.argmaxes += 1
        return super().argmax(rows)

    def __getitem__(self, index):
        self.fetches += 1
        return super().__getitem__(index)


def test_rows_slices_and_argmax_on_cpu_and_bfloat16_sim():
    host = np.random.default_rng(0).standard_normal((5, V)).astype(np.float32)
    for backend, data in [(get_backend("cpu"), host), (get_backend("sim", "bfloat16"), bf16_from_f32(host))]:
        logits = DeviceLogits(backend, data)
        want = backend.to_numpy(data)
        assert logits.shape == (5, V) and len(logits) == 5
        np.testing.assert_array_equal(logits[[3, 1]], want[[3, 1]])
        np.testing.assert_array_equal(logits[1:3], want[1:3])
        np.testing.assert_array_equal(logits[2:3, :7], want[2:3, :7])
        assert logits[[0]].dtype == np.float32
        np.testing.assert_array_equal(logits.argmax([4, 0, 2]), want[[4, 0, 2]].argmax(-1))
        np.testing.assert_array_equal(logits.argmax(np.arange(5)), want.argmax(-1))


@pytest.mark.parametrize(
    "params,output,fast",
    [
        (SamplingParams(temperature=0), (), True),
        (SamplingParams(temperature=0, min_tokens=2), (5, 6), True),  # min_tokens already met
        (SamplingParams(temperature=0, min_tokens=3), (5, 6), False),  # EOS still banned
        (SamplingParams(temperature=0, logprobs=2), (), False),
        (SamplingParams(temperature=0, repetition_penalty=1.3), (), False),
        (SamplingParams(temperature=0, presence_penalty=0.5), (), False),
        (SamplingParams(temperature=0, logit_bias={3: 5.0}), (), False),
        (SamplingParams(temperature=0.7, seed=1), (), False),
    ],
)
def test_sample_rows_takes_the_device_path_only_when_nothing_edits_the_logits(params, output, fast):
    rng = np.random.default_rng(1)
    data = rng.standard_normal((4, V)).astype(np.float32)
    data[:, EOS] = 10.0  # EOS is everyone's argmax unless min_tokens bans it
    sampler = Sampler(V, [EOS])
    rows = [3, 0]
    seqs = [seq_with(params, seed=i, output=output) for i in range(2)]
    logits = CountingLogits(get_backend("cpu"), data)
    got = sampler.sample_rows(logits, rows, seqs)
    twins = [seq_with(params, seed=i, output=output) for i in range(2)]  # fresh generators
    want = sampler(data[rows], twins)
    np.testing.assert_array_equal(got.token_ids, want.token_ids)
    assert (logits.argmaxes, logits.fetches) == ((1, 0) if fast else (0, 1))
    if fast:
        assert np.isnan(got.logprobs).all() and got.top_ids == [None, None]
