"""Optional features are composed at setup, outside the step (issue 41): with no
speculation, no grammar, no beams and no LoRA, a step runs none of their code. The
engine holds None for an absent speculative decoder and checks the batch for grammars
and beams before it calls into them."""

import sys
from pathlib import Path

from rawpage import LLM, SamplingParams
from rawpage.structured_output import StructuredOutputsParams

ROOT = Path(__file__).resolve().parent.parent
OPTIONAL = {
    "speculative decoding": "rawpage/spec_decode/",
    "structured outputs": "rawpage/structured_output/",
    "beam search": "rawpage/beam_search.py",
    "LoRA": "rawpage/lora/",
}


def files_run_by_steps(llm: LLM, prompts, params) -> set[str]:
    """The rawpage files any of whose functions ran inside LLMEngine.step()."""
    found: set[str] = set()
    eng = llm.engine
    step = eng.step

    def on_call(frame, event, _arg):
        if event == "call" and frame.f_code.co_filename.startswith(str(ROOT)):
            found.add(Path(frame.f_code.co_filename).relative_to(ROOT).as_posix())

    def traced_step():
        sys.setprofile(on_call)
        try:
            return step()
        finally:
            sys.setprofile(None)

    eng.step = traced_step
    try:
        for i, p in enumerate(prompts):
            eng.add_request(str(i), p, params)
        while eng.has_unfinished_requests():
            eng.step()
    finally:
        del eng.step  # the class's own again
    return found


def features_run(files: set[str]) -> set[str]:
    return {name for name, prefix in OPTIONAL.items() if any(f.startswith(prefix) for f in files)}


def test_a_plain_step_runs_no_optional_feature(tiny_model_dir):
    llm = LLM(tiny_model_dir)
    prompts = [{"prompt_token_ids": list(range(5, 40))}, {"prompt_token_ids": list(range(9, 20))}]
    files = files_run_by_steps(llm, prompts, SamplingParams(temperature=0.8, seed=3, max_tokens=6))
    assert "rawpage/scheduler.py" in files  # the trace works
    assert not features_run(files), sorted(f for f in files if features_run({f}))


def test_the_trace_sees_a_feature_when_a_request_uses_it(tiny_model_dir):
    llm = LLM(tiny_model_dir)
    so = StructuredOutputsParams(choice=["yes", "no"])
    files = files_run_by_steps(llm, [{"prompt_token_ids": [5, 6, 7]}], SamplingParams(structured_outputs=so))
    assert features_run(files) == {"structured outputs"}
    beams = SamplingParams(n=2, use_beam_search=True, max_tokens=3)
    assert features_run(files_run_by_steps(llm, [{"prompt_token_ids": [5, 6, 7]}], beams)) == {"beam search"}
    spec = LLM(tiny_model_dir, speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    files = files_run_by_steps(spec, [{"prompt_token_ids": [5, 6, 7, 8] * 6}], SamplingParams(max_tokens=8))
    assert features_run(files) == {"speculative decoding"}
