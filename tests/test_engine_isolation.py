"""One request cannot stop the engine: bad parameters are refused up front, and an
exception while stepping fails only the requests it touched."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rawpage import LLM, SamplingParams
from rawpage.engine import MAX_CONSECUTIVE_STEP_FAILURES
from tests.model_harness import assert_no_leaks

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": list(range(10 + i, 30 + 3 * i))} for i in range(6)]


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(tiny_model_dir, max_model_len=256, max_num_seqs=16)


@pytest.fixture(scope="module")
def alone(llm):
    return [llm.generate(p, GREEDY, use_tqdm=False)[0].outputs[0].token_ids for p in PROMPTS]


def run(engine, params_for):
    """Add PROMPTS with params_for(i) and step to the end; outputs by request id."""
    for i, p in enumerate(PROMPTS):
        engine.add_request(str(i), p, params_for(i))
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    return final


@pytest.mark.parametrize(
    "kwargs,param",
    [
        (dict(min_tokens=2, stop_token_ids=[999999999]), "stop_token_ids"),
        (dict(logit_bias={10**22: 5.0}), "logit_bias"),
        (dict(logit_bias={400: 5.0}), "logit_bias"),
    ],
)
def test_token_ids_outside_the_vocabulary_are_refused(llm, kwargs, param):
    with pytest.raises(ValueError, match=f"^{param}: token ids"):
        llm.engine.add_request("bad", PROMPTS[0], SamplingParams(max_tokens=4, **kwargs))
    assert_no_leaks(llm.engine)


@pytest.mark.parametrize("penalty", [600, -1e308, float("nan")])
def test_length_penalty_is_bounded(penalty):
    with pytest.raises(ValueError, match="^length_penalty"):
        SamplingParams(use_beam_search=True, n=2, length_penalty=penalty)


def test_a_request_that_breaks_the_sampler_fails_alone(llm, alone, monkeypatch):
    engine = llm.engine
    real = engine.sampler.apply_processors

    def flaky(logits, seqs):
        if any(s.request.request_id == "2" for s in seqs):
            raise IndexError("injected")
        return real(logits, seqs)

    monkeypatch.setattr(engine.sampler, "apply_processors", flaky)
    # Every request edits logits (repetition_penalty 1.0 -> no; use logit_bias) so the processors run.
    final = run(engine, lambda i: SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logit_bias={0: 0.0}))
    assert final["2"].error == "IndexError: injected"
    assert final["2"].outputs[0].finish_reason == "abort"
    for i in (0, 1, 3, 4, 5):
        assert final[str(i)].error is None and final[str(i)].outputs[0].token_ids == alone[i]
    assert_no_leaks(engine)


def test_a_failed_forward_pass_fails_its_batch_and_the_engine_goes_on(llm, alone, monkeypatch):
    engine = llm.engine
    real, calls = engine.runner.execute, []

    def once(*a, **kw):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected device error")
        return real(*a, **kw)

    monkeypatch.setattr(engine.runner, "execute", once)
    final = run(engine, lambda i: GREEDY)
    failed = [rid for rid, o in final.items() if o.error]
    assert failed and all("injected device error" in final[r].error for r in failed)
    assert_no_leaks(engine)
    # Afterwards the same engine serves the same prompts correctly.
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == alone


def test_a_failure_that_repeats_whatever_the_requests_stops_the_engine(llm, monkeypatch):
    engine = llm.engine
    monkeypatch.setattr(engine.runner, "execute", lambda *a, **kw: (_ for _ in ()).throw(RuntimeError("dead GPU")))
    with pytest.raises(RuntimeError, match="dead GPU"):
        for i in range(MAX_CONSECUTIVE_STEP_FAILURES + 2):
            engine.add_request(f"d{i}", PROMPTS[0], GREEDY)
            engine.step()
    monkeypatch.undo()
    engine.abort_request([f"d{i}" for i in range(MAX_CONSECUTIVE_STEP_FAILURES + 2)])
    while engine.has_unfinished_requests():
        engine.step()
    assert_no_leaks(engine)


_token = st.one_of(st.integers(-5, 420), st.integers(-(2**70), 2**70))
_params = st.fixed_dictionaries(
    {},
    optional={
        "n": st.integers(-1, 20),
        "temperature": st.one_of(st.floats(-1, 3), st.just(0.0)),
        "top_p": st.floats(-0.5, 1.5),
        "top_k": st.integers(-3, 500),
        "min_p": st.floats(-0.5, 1.5),
        "presence_penalty": st.floats(-3, 3),
        "frequency_penalty": st.floats(-3, 3),
        "repetition_penalty": st.floats(-1, 3),
        "seed": st.integers(-5, 2**64),
        "max_tokens": st.integers(-1, 12),
        "min_tokens": st.integers(-1, 12),
        "stop": st.lists(st.text(max_size=3), max_size=3),
        "stop_token_ids": st.lists(_token, max_size=3),
        "ignore_eos": st.booleans(),
        "logprobs": st.integers(-1, 25),
        "prompt_logprobs": st.integers(-1, 25),
        "logit_bias": st.dictionaries(_token, st.one_of(st.floats(-200, 200), st.just(float("nan"))), max_size=3),
        "use_beam_search": st.booleans(),
        "length_penalty": st.floats(allow_nan=True, allow_infinity=True),
        "early_stopping": st.sampled_from([True, False, "never"]),
        "skip_special_tokens": st.booleans(),
    },
)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(batch=st.lists(_params, min_size=1, max_size=4), prompt_len=st.integers(1, 40))
def test_fuzzed_parameters_never_break_the_engine(llm, alone, batch, prompt_len):
    """Random parameter combinations, several in one batch: each is either refused with a
    ValueError or runs to the end; no request fails inside the engine, nothing leaks, and
    the engine still gives the reference answer afterwards."""
    engine = llm.engine
    rng = np.random.default_rng(prompt_len)
    for i, kwargs in enumerate(batch):
        try:
            params = SamplingParams(**kwargs)
            engine.add_request(f"f{i}", {"prompt_token_ids": rng.integers(3, 400, prompt_len).tolist()}, params)
        except (ValueError, TypeError):
            continue
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.error is None, out.error
    assert_no_leaks(engine)
    assert llm.generate(PROMPTS[0], GREEDY, use_tqdm=False)[0].outputs[0].token_ids == alone[0]
