"""One owner for a sequence's life (issue 41): once a Sequence exists, only sequence.py's
own methods, the scheduler and its block manager change it. The runner, the sampler,
the output processor, beam search, speculative decoding and the pooling engine return
data and decisions (a token, a Stop) that the scheduler applies.

Held two ways: every attribute assignment on a Sequence during a workload that uses
every feature that touches one (n > 1, beams, stop strings and tokens, a grammar,
swap and recompute preemption, an abort, n-gram speculation, embeddings) is traced to
its module; and no module outside the three mutates a Sequence's lists in place."""

import ast
import sys
from pathlib import Path

from rawpage import LLM, SamplingParams
from rawpage.sequence import Sequence
from rawpage.structured_output import StructuredOutputsParams
from tests.model_harness import assert_no_leaks

ROOT = Path(__file__).resolve().parent.parent
OWNERS = {"rawpage.sequence", "rawpage.scheduler", "rawpage.block_manager"}
LIST_FIELDS = {"token_ids", "logprobs", "block_table", "cpu_block_table", "block_hashes"}
# Modules whose in-place list edits are on records of their own, not on a Sequence.
OWN_RECORDS = {
    "rawpage/spec_decode/draft_model.py": "DraftSequence, the draft model's record of a target sequence",
}


def writers_during(monkeypatch, run) -> set[str]:
    """The modules that assigned an attribute of a Sequence while `run()` ran."""
    found: set[str] = set()
    plain = object.__setattr__

    def traced(self, name, value):
        found.add(sys._getframe(1).f_globals.get("__name__", "?"))
        plain(self, name, value)

    monkeypatch.setattr(Sequence, "__setattr__", traced)
    run()
    return found


def every_feature(tiny_model_dir):
    """A workload that reaches every module that handles sequences."""
    swap = LLM(tiny_model_dir, num_gpu_blocks_override=24, max_model_len=256, preemption_mode="swap", swap_space=1)
    recompute = LLM(tiny_model_dir, num_gpu_blocks_override=24, max_model_len=256, preemption_mode="recompute")
    spec = LLM(tiny_model_dir, speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    prompts = [{"prompt_token_ids": list(range(5, 5 + 40 + 7 * i))} for i in range(6)]
    json_object = StructuredOutputsParams(json_object=True)
    for llm in (swap, recompute):
        llm.generate(prompts, SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=30, logprobs=2), use_tqdm=False)
    swap.generate(prompts[:2], SamplingParams(n=2, use_beam_search=True, max_tokens=8), use_tqdm=False)
    swap.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=12, stop=["a", "e"], stop_token_ids=[7]))
    swap.generate(prompts[:1], SamplingParams(max_tokens=10, structured_outputs=json_object), use_tqdm=False)
    repetitive = [{"prompt_token_ids": [5, 6, 7, 8] * 12}]
    spec.generate(repetitive, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True), use_tqdm=False)
    eng = swap.engine
    eng.add_request("gone", prompts[0], SamplingParams(max_tokens=50, ignore_eos=True))
    eng.step()
    eng.abort_request("gone")
    eng.step()
    for llm in (swap, recompute, spec):
        assert_no_leaks(llm.engine)
    assert swap.engine.scheduler.num_swap_outs and recompute.engine.scheduler.num_preemptions


def test_only_the_scheduler_changes_a_sequence(tiny_model_dir, monkeypatch):
    writers = writers_during(monkeypatch, lambda: every_feature(tiny_model_dir))
    assert "rawpage.scheduler" in writers  # the trace works
    assert writers <= OWNERS, f"Sequence fields written from {sorted(writers - OWNERS)}"


def test_embeddings_leave_sequences_to_the_scheduler(tiny_model_dir, monkeypatch):
    def run():
        llm = LLM(tiny_model_dir, runner="pooling")
        llm.embed(["one two three", "four five"], use_tqdm=False)

    assert writers_during(monkeypatch, run) <= OWNERS


def test_the_trace_sees_a_write_from_elsewhere(tiny_model_dir, monkeypatch):
    def run():
        llm = LLM(tiny_model_dir)
        llm.engine.add_request("r", {"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=2))
        llm.engine.requests["r"].seqs[0].stop_reason = "written here"  # what the engine must never do

    assert __name__ in writers_during(monkeypatch, run)


def test_no_module_edits_a_sequences_lists_in_place():
    found = []
    for path in sorted((ROOT / "rawpage").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("rawpage/sequence.py", "rawpage/scheduler.py", "rawpage/block_manager.py") or rel in OWN_RECORDS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                targets = [node.func.value] if node.func.attr in ("append", "extend", "pop", "insert", "clear") else []
            elif isinstance(node, ast.AugAssign):
                targets = [node.target]
            elif isinstance(node, ast.Delete):
                targets = [t.value if isinstance(t, ast.Subscript) else t for t in node.targets]
            found += [
                f"{rel}:{node.lineno}"
                for t in targets
                if isinstance(t, ast.Attribute) and t.attr in LIST_FIELDS and isinstance(t.ctx, ast.Load | ast.Del)
            ]
    assert not found, f"in-place edits of a Sequence's lists outside the scheduler: {found}"
