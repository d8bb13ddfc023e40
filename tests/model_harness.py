"""Drive a model's forward pass directly, without the engine: one sequence at a time,
with a paged KV cache whose block table is deliberately scattered."""

from __future__ import annotations

import numpy as np

from rawpage.forward_batch import ForwardBatch


class SingleSequence:
    def __init__(self, model, block_size: int = 16, num_blocks: int = 64, seed: int = 0) -> None:
        c, b = model.config, model.backend
        self.model, self.bs = model, block_size
        shape = (num_blocks, block_size, c.num_kv_heads, c.head_dim)
        self.kv = [(b.zeros(shape), b.zeros(shape)) for _ in range(c.num_layers)]
        self.table = np.random.default_rng(seed).permutation(num_blocks).astype(np.int32)
        self.length = 0

    def feed(self, ids: list[int], all_logits: bool = False, mm=None) -> np.ndarray:
        """Run `ids` as the next chunk; return logits of the last token (V,) or of all (n, V).
        mm: the chunk's image rows (a MultimodalBatch), for a vision-language model."""
        n, start = len(ids), self.length
        pos = np.arange(start, start + n, dtype=np.int32)
        slots = (self.table[pos // self.bs] * self.bs + pos % self.bs).astype(np.int32)
        b = self.model.backend
        rows = np.arange(n, dtype=np.int32) if all_logits else np.array([n - 1], np.int32)
        batch = ForwardBatch(
            input_ids=b.asarray(np.array(ids, np.int32), np.int32),
            positions=b.asarray(pos, np.int32),
            slot_mapping=b.asarray(slots, np.int32),
            block_tables=b.asarray(self.table[None, :], np.int32),
            seq_lens=b.asarray(np.array([start + n], np.int32), np.int32),
            query_start_loc=b.asarray(np.array([0, n], np.int32), np.int32),
            logits_indices=b.asarray(rows, np.int32),
            host_query_lens=np.array([n]),
            host_seq_lens=np.array([start + n]),
            mm=mm,
            key_end=None if mm is None or mm.key_end is None else b.asarray(mm.key_end, np.int32),
        )
        self.length += n
        logits = self.model.compute_logits(self.model.forward(batch, self.kv))
        if logits is None:  # a tensor-parallel rank other than 0: rank 0 has the logits
            return None
        logits = b.to_numpy(logits)
        return logits.astype(np.float32) if all_logits else logits[0].astype(np.float32)

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        out, logits = [], self.feed(prompt)
        for _ in range(n):
            out.append(int(logits.argmax()))
            logits = self.feed([out[-1]])
        return out


def image_rows(model, ids: list[int], images: list, image_token: int, bidirectional: bool = True):
    """The MultimodalBatch of a one-sequence prompt `ids` fed in one chunk: each run of
    image_token takes the next PIL image's soft tokens (model.encode_image) and, if
    bidirectional, sees its whole image (else attends causally, as text does)."""
    from rawpage.multimodal.image_input import image_input
    from rawpage.multimodal.mm_batch import MultimodalBatch

    vc = model.config.vision
    n = vc.tokens_per_image
    runs = [i for i in range(len(ids)) if ids[i] == image_token and (i == 0 or ids[i - 1] != image_token)]
    embeds = [model.encode_image(image_input(im, vc).pixels) for im in images]  # each (n, dim)
    key_end = np.full(len(ids), -1, np.int32)
    for r in runs if bidirectional else ():
        key_end[r : r + n] = r + n - 1
    rows = np.concatenate([np.arange(r, r + n) for r in runs])
    return MultimodalBatch(rows, np.concatenate(embeds), key_end if bidirectional else None)


def assert_no_leaks(engine):
    """Every KV block is back in the free pool and nothing holds a reference."""
    bm = engine.block_manager
    assert not engine.has_unfinished_requests()
    assert bm.num_free_blocks == bm.num_blocks, f"{bm.num_blocks - bm.num_free_blocks} blocks leaked"
    assert not any(bm.ref_counts)


def two_rank_llm(folder: str, **kwargs):
    """For a module fixture: an LLM at --tensor-parallel-size 2 (one spawned worker),
    yielded, then its worker closed."""
    from rawpage import LLM

    llm = LLM(folder, tensor_parallel_size=2, **kwargs)
    yield llm
    llm.engine.workers.close()


def check_two_ranks_match_one(llm, llm_tp2, prompt: dict, greedy: list[int]) -> None:
    """One rank's and two ranks' greedy tokens (the recorded ones) and top-5 log-probabilities
    (within 1e-5) for an image prompt, the prompt's images encoded once, on rank 0."""
    from rawpage import SamplingParams

    p = SamplingParams(temperature=0, max_tokens=len(greedy), logprobs=5)
    llm.reset_prefix_cache()
    (one,) = llm.generate(prompt, p, use_tqdm=False)
    (two,) = llm_tp2.generate(prompt, p, use_tqdm=False)
    assert len(llm_tp2.engine.workers.procs) == 1
    assert list(two.outputs[0].token_ids) == list(one.outputs[0].token_ids) == greedy
    for a, b in zip(one.outputs[0].logprobs, two.outputs[0].logprobs, strict=True):
        assert a.keys() == b.keys()
        np.testing.assert_allclose([b[t].logprob for t in a], [a[t].logprob for t in a], atol=1e-5, rtol=0)
    assert llm_tp2.engine.runner.encoder_cache.misses == len(prompt["multi_modal_data"]["image"])
