"""Batch metadata: the runner's vectorized build_batch against a plain loop over
sequences, and BatchBuffer's single host-to-device copy into views of one buffer."""

import numpy as np

from rawpage.backends import get_backend
from rawpage.forward_batch import FIELDS, BatchBuffer, HostBatch
from rawpage.model_runner import ModelRunner

BS = 16


class FakeSeq:
    def __init__(self, token_ids, num_computed, block_table):
        self.token_ids, self.num_computed_tokens, self.block_table = token_ids, num_computed, block_table


def loop_reference(scheduled, logits_rows, bs):
    """The batch, one token at a time: what build_batch must equal."""
    ids, pos, slots, qsl, rows = [], [], [], [0], []
    width = max(len(s.block_table) for s, _ in scheduled)
    tables = np.zeros((len(scheduled), width), np.int32)
    for i, (s, n) in enumerate(scheduled):
        tables[i, : len(s.block_table)] = s.block_table
        for j in range(s.num_computed_tokens, s.num_computed_tokens + n):
            ids.append(s.token_ids[j])
            pos.append(j)
            slots.append(s.block_table[j // bs] * bs + j % bs)
        rows += [qsl[-1] + r for r in logits_rows[i]]
        qsl.append(qsl[-1] + n)
    seq_lens = [s.num_computed_tokens + n for s, n in scheduled]
    return ids, pos, slots, seq_lens, qsl, rows, tables


def random_schedule(rng, B):
    scheduled, logits_rows = [], []
    free = list(rng.permutation(4000))
    for _ in range(B):
        total = int(rng.integers(1, 300))
        done = int(rng.integers(0, total))
        n = int(rng.integers(1, total - done + 1))
        table = [int(free.pop()) for _ in range(-(-(done + n) // BS))]
        scheduled.append((FakeSeq(rng.integers(0, 1000, total).tolist(), done, table), n))
        logits_rows.append(np.array([n - 1]) if rng.random() < 0.8 else np.arange(0))
    return scheduled, logits_rows


def test_build_batch_equals_the_loop():
    rng = np.random.default_rng(0)
    runner = ModelRunner.__new__(ModelRunner)  # build_batch needs only the block size (and no images)
    runner.encoder_cache, runner.mrope_merge = None, 0
    runner.block_size = BS
    for B in (1, 5, 64):
        scheduled, logits_rows = random_schedule(rng, B)
        hb = runner.build_batch(scheduled, logits_rows)
        ids, pos, slots, seq_lens, qsl, rows, tables = loop_reference(scheduled, logits_rows, BS)
        for got, want in [
            (hb.input_ids, ids),
            (hb.positions, pos),
            (hb.slot_mapping, slots),
            (hb.seq_lens, seq_lens),
            (hb.query_start_loc, qsl),
            (hb.logits_indices, rows),
        ]:
            np.testing.assert_array_equal(got, want)
            assert got.dtype == np.int32
        np.testing.assert_array_equal(hb.block_tables, tables)


class CountingBackend:
    def __init__(self, backend):
        self.backend, self.copies = backend, []

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def copy_from_host(self, dst, src):
        self.copies.append(src.size)
        self.backend.copy_from_host(dst, src)


def test_upload_is_one_copy_into_views_of_one_buffer():
    rng = np.random.default_rng(1)
    runner = ModelRunner.__new__(ModelRunner)
    runner.block_size, runner.encoder_cache, runner.mrope_merge = BS, None, 0
    hb = runner.build_batch(*random_schedule(rng, 7))
    backend = CountingBackend(get_backend("cpu"))
    buffer = BatchBuffer(backend, capacity=16)
    batch = buffer.upload(hb)
    assert backend.copies == [hb.num_ints()], "one host-to-device copy of everything"
    for f in FIELDS:
        np.testing.assert_array_equal(getattr(batch, f), getattr(hb, f))
        assert np.shares_memory(getattr(batch, f), buffer.device)
    np.testing.assert_array_equal(batch.host_query_lens, np.diff(hb.query_start_loc))
    # attention's metadata, built once per step: the same device views, the maxima from the host
    assert batch.attn.block_tables is batch.block_tables and batch.attn.seq_lens is batch.seq_lens
    assert batch.attn.query_start_loc is batch.query_start_loc
    assert (batch.attn.max_query_len, batch.attn.max_seq_len) == (hb.query_lens.max(), hb.seq_lens.max())
    assert buffer.device.shape[0] >= hb.num_ints(), "an unfrozen buffer grows to fit"


def test_is_decode():
    def hb(q_lens):
        qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        T, B = int(qsl[-1]), len(q_lens)
        z = np.zeros(T, np.int32)
        return HostBatch(z, z, z, np.ones(B, np.int32), qsl, np.zeros(0, np.int32), np.zeros((B, 1), np.int32))

    assert hb([1, 1, 1]).is_decode
    assert not hb([1, 2, 1]).is_decode
    assert not hb([]).is_decode
