"""Structured outputs on the tiny random model: the mask logic, and that every sampled
output follows its grammar however the batch is shared, forked or preempted."""

import functools
import json
import re
from typing import Literal

import numpy as np
import pytest
from pydantic import BaseModel, ConfigDict, Field

from rawpage import LLM, SamplingParams
from rawpage.errors import InvalidRequestError
from rawpage.structured_output import StructuredOutputsParams, apply_masks
from tests.model_harness import assert_no_leaks


class Point(BaseModel):
    model_config = ConfigDict(extra="forbid")  # the random model would otherwise invent keys
    x: int = Field(ge=-5, le=5)
    y: int = Field(ge=0, le=9)


class Shape(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["circle", "square", "line"]
    closed: bool
    points: list[Point] = Field(min_length=1, max_length=3)


SCHEMA = Shape.model_json_schema()
PROMPTS = [{"prompt_token_ids": list(range(5 + i, 25 + 2 * i))} for i in range(6)]


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(tiny_model_dir)


def texts(outs):
    return [c.text for o in outs for c in o.outputs]


def sampled(**kw):
    return SamplingParams(**{"temperature": 1.0, "max_tokens": 300, **kw})


def test_json_schema_outputs_validate_at_temperature_one(llm):
    outs = [
        llm.generate(PROMPTS[0], sampled(seed=s, structured_outputs={"json": SCHEMA}), use_tqdm=False)[0]
        for s in range(12)
    ]
    for o in outs:
        assert o.outputs[0].finish_reason == "stop", o.outputs[0].text
        Shape.model_validate_json(o.outputs[0].text)
    assert len(set(texts(outs))) > 1, "seeds should give different valid outputs"
    assert_no_leaks(llm.engine)


def test_choice_regex_and_lark(llm):
    choice = texts(
        llm.generate(PROMPTS, sampled(structured_outputs={"choice": ["red", "green", "blue"]}), use_tqdm=False)
    )
    assert set(choice) <= {"red", "green", "blue"}
    rx = texts(llm.generate(PROMPTS, sampled(structured_outputs={"regex": r"[0-9]{3}-[a-z]{2}"}), use_tqdm=False))
    assert all(re.fullmatch(r"[0-9]{3}-[a-z]{2}", t) for t in rx), rx
    lark = 'start: "(" num ("," num)* ")"\nnum: /[0-9]{1,2}/'
    out = texts(llm.generate(PROMPTS, sampled(structured_outputs={"grammar": lark}), use_tqdm=False))
    assert all(re.fullmatch(r"\(\d{1,2}(,\d{1,2})*\)", t) for t in out), out


def test_json_object_and_greedy_against_a_bias_for_a_forbidden_token(llm):
    brace = llm.get_tokenizer().encode("{", add_special_tokens=False)[0]
    x = llm.get_tokenizer().encode("x", add_special_tokens=False)[0]
    # greedy would pick "x" forever; the grammar only allows the JSON object's opening
    p = SamplingParams(temperature=0, max_tokens=200, logit_bias={x: 100.0}, structured_outputs={"json_object": True})
    (out,) = llm.generate(PROMPTS[1], p, use_tqdm=False)
    assert out.outputs[0].token_ids[0] == brace
    if out.outputs[0].finish_reason == "stop":
        assert isinstance(json.loads(out.outputs[0].text), dict)


def test_mask_bits_match_the_matcher_for_every_token(llm):
    """Our unpacked mask is llguidance's own bitmask, bit for bit, and every token it allows
    can be consumed. (The converse does not hold: llguidance also forbids non-canonical
    tokenizations, e.g. "i" when "ind" spells the same key.)"""
    eng = llm.engine
    state = eng.grammars.new_state(
        StructuredOutputsParams(json=SCHEMA), functools.partial(eng.tokenizer.encode, add_special_tokens=False)
    )
    rng = np.random.default_rng(0)
    V = eng.model_config.vocab_size
    for _ in range(12):
        logits = np.zeros((1, V), dtype=np.float32)
        seq = type("S", (), {"grammar": state})()
        apply_masks(logits, [seq], None)
        allowed = np.isfinite(logits[0])
        theirs = np.unpackbits(np.frombuffer(state.matcher.compute_bitmask(), np.uint8), bitorder="little")
        assert (allowed == theirs[:V].astype(bool)).all()
        for t in np.flatnonzero(allowed):
            assert state.matcher.deep_copy().try_consume_tokens([int(t)]) == 1, t
        if state.matcher.is_stopped():
            break
        state.accept(int(rng.choice(np.flatnonzero(allowed))))


def test_n_beam_search_prefix_caching_and_preemption_keep_outputs_valid(tiny_model_dir, llm):
    so = {"json": SCHEMA}
    outs = llm.generate(PROMPTS[:2], sampled(n=4, seed=3, structured_outputs=so), use_tqdm=False)
    again = llm.generate(PROMPTS[:2], sampled(n=4, seed=3, structured_outputs=so), use_tqdm=False)  # cached prompt
    assert texts(outs) == texts(again)
    assert llm.engine.block_manager.prefix_hits > 0
    beams = llm.generate(
        PROMPTS[2],
        SamplingParams(n=3, use_beam_search=True, temperature=0, max_tokens=120, structured_outputs=so),
        use_tqdm=False,
    )
    for t in texts(outs) + texts(beams):
        Shape.model_validate_json(t)
    small = LLM(
        tiny_model_dir,
        num_gpu_blocks_override=12,
        max_num_batched_tokens=64,
        max_model_len=192,
        enable_prefix_caching=False,
    )
    squeezed = small.generate(PROMPTS, sampled(seed=5, max_tokens=150, structured_outputs=so), use_tqdm=False)
    assert small.engine.scheduler.num_preemptions > 0, "the pool was meant to force preemption"
    alone = [
        small.generate(p, sampled(seed=5, max_tokens=150, structured_outputs=so), use_tqdm=False)[0] for p in PROMPTS
    ]
    assert texts(squeezed) == texts(alone)  # the grammar state survived recompute
    for o in squeezed:
        if o.outputs[0].finish_reason == "stop":
            Shape.model_validate_json(o.outputs[0].text)
    assert_no_leaks(small.engine)


def test_constraint_starts_after_the_reasoning_tag(llm):
    eng = llm.engine
    encode = functools.partial(eng.tokenizer.encode, add_special_tokens=False)
    so = StructuredOutputsParams(choice=["yes"], reasoning=("<think>", "</think>"))
    state = eng.grammars.new_state(so, encode("assistant: <think>"))
    assert state.matcher is None  # the prompt opened the block: free while thinking
    for t in encode("hmm</think>"):
        state.accept(t)
    assert state.matcher is not None and not state.matcher.is_stopped()


def test_without_a_think_block_the_constraint_applies_from_the_start(llm):
    """vllm#27447: a model that never writes </think> got no constraint at all. After a
    prompt that closed the block, only the grammar; after one with no block, the grammar
    or a block the model opens itself (which this random model sometimes does)."""
    so = {"choice": ["yes", "no"], "reasoning": ("<think>", "</think>")}
    for seed in range(4):
        for prompt, may_think in (("assistant: <think>\n\n</think>\n\n", False), ("assistant:", True)):
            ids = llm.get_tokenizer().encode(prompt)
            p = sampled(seed=seed, max_tokens=8, structured_outputs=dict(so))
            o = llm.generate({"prompt_token_ids": ids}, p, use_tqdm=False)[0].outputs[0]
            thought = may_think and o.text.startswith("<think>")
            assert thought or (o.text in ("yes", "no") and o.finish_reason == "stop"), (prompt, o)


@pytest.mark.parametrize(
    "so, field",
    [
        ({"json": {"type": "nonsense"}}, "structured_outputs"),
        ({"regex": "(unclosed"}, "structured_outputs"),
        ({"grammar": "start: undefined_rule"}, "structured_outputs"),
        ({"json": SCHEMA, "regex": "a"}, "structured_outputs"),
        ({"choice": []}, "choice"),
    ],
)
def test_bad_constraints_are_refused_before_running(llm, so, field):
    with pytest.raises(InvalidRequestError) as e:
        llm.generate(PROMPTS[0], SamplingParams(structured_outputs=so), use_tqdm=False)
    assert e.value.param == field


def test_min_tokens_against_a_finished_grammar_ends_cleanly(llm):
    """choice "a" is done after one token; min_tokens bans the EOS that the grammar then
    demands. The grammar wins instead of the sampler drawing from an all -inf row."""
    p = SamplingParams(temperature=1.0, max_tokens=6, min_tokens=3, structured_outputs={"choice": ["a"]})
    (out,) = llm.generate(PROMPTS[0], p, use_tqdm=False)
    eos = llm.engine.model_config.eos_token_ids
    first, *rest = out.outputs[0].token_ids
    assert llm.get_tokenizer().decode([first]) == "a" and rest and all(t in eos for t in rest), out.outputs[0]
    assert_no_leaks(llm.engine)


def test_grammar_state_survives_swapping(tiny_model_dir):
    so = {"json": SCHEMA}
    small = LLM(
        tiny_model_dir,
        num_gpu_blocks_override=12,
        max_num_batched_tokens=64,
        max_model_len=192,
        enable_prefix_caching=False,
        preemption_mode="swap",
        swap_space=0.01,
    )
    squeezed = small.generate(PROMPTS, sampled(seed=6, max_tokens=150, structured_outputs=so), use_tqdm=False)
    assert small.engine.scheduler.num_swap_outs > 0, "the pool was meant to force swapping"
    alone = [
        small.generate(p, sampled(seed=6, max_tokens=150, structured_outputs=so), use_tqdm=False)[0] for p in PROMPTS
    ]
    assert texts(squeezed) == texts(alone)
    assert_no_leaks(small.engine)


def test_beam_search_never_keeps_a_beam_the_grammar_forbids(llm):
    """issue 29 item 8: -inf candidates (forbidden tokens) became beams when the grammar
    allowed fewer tokens than the width; now fewer beams are kept."""
    p = SamplingParams(n=4, use_beam_search=True, temperature=0, max_tokens=12, structured_outputs={"choice": ["yes"]})
    (out,) = llm.generate(PROMPTS[0], p, use_tqdm=False)
    assert {o.text for o in out.outputs} == {"yes"}, out.outputs
    assert_no_leaks(llm.engine)


def test_a_grammar_that_can_never_finish_is_refused_or_ends_length_never_stop(llm):
    """issue 29 item 8: {"$ref": "#"} cannot even start: refused at admission. A schema
    that must nest itself forever is only found out mid-output: "length", flagged."""
    with pytest.raises(InvalidRequestError, match="can never be satisfied"):
        llm.generate(PROMPTS[0], SamplingParams(structured_outputs={"json": {"$ref": "#"}}), use_tqdm=False)
    forever = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}
    (out,) = llm.generate(PROMPTS[0], sampled(max_tokens=40, structured_outputs={"json": forever}), use_tqdm=False)
    assert out.outputs[0].finish_reason == "length", out.outputs[0]


# issue 42: an integer or number without bounds let the model write digits until max_tokens
NUMBERS = {
    "type": "object",
    "properties": {
        "population": {"type": "integer"},
        "area": {"type": ["number", "null"]},
        "ids": {"type": "array", "items": {"type": "integer", "minimum": 0}, "maxItems": 3},
    },
    "required": ["population", "area", "ids"],
    "additionalProperties": False,
}


def digit_tokens(llm):
    vocab = llm.engine.grammars.decode_each(list(range(llm.engine.model_config.vocab_size)))
    return [t for t, text in enumerate(vocab) if text and text[0].isdigit()]


@pytest.mark.parametrize(
    ("prefix", "digits"),
    [
        ('{"population":', 16),
        ('{"population":-', 16),
        ('{"population":1,"area":', 16),
        ('{"population":1,"area":0.', 10),
    ],
)
def test_a_number_without_bounds_stops_at_its_cap(llm, prefix, digits):
    """16 digits are accepted, and the mask then allows no 17th (nor an 11th after the point)."""
    state = llm.engine.grammars.new_state(StructuredOutputsParams(json=NUMBERS), [])
    encode = functools.partial(llm.get_tokenizer().encode, add_special_tokens=False)
    ids = encode(prefix + "9" * digits)
    assert state.matcher.try_consume_tokens(ids) == len(ids), state.matcher.get_error()
    allowed = np.unpackbits(np.frombuffer(state.matcher.compute_bitmask(), np.uint8), bitorder="little")
    refused = digit_tokens(llm)
    assert refused and not allowed[refused].any()
    assert allowed[encode(",")[0]] or allowed[encode("}")[0]]


def test_numbers_without_bounds_always_finish_at_temperature_one(llm):
    """issue 42: however much the model favours digits, every reply closes its JSON well
    within max_tokens (without the caps, each of these wrote digits until the limit)."""
    import jsonschema

    favour = {t: 8.0 for t in digit_tokens(llm)}
    p = [sampled(seed=s, max_tokens=200, logit_bias=favour, structured_outputs={"json": NUMBERS}) for s in range(12)]
    outs = llm.generate([PROMPTS[s % len(PROMPTS)] for s in range(12)], p, use_tqdm=False)
    for o in outs:
        assert o.outputs[0].finish_reason == "stop", o.outputs[0].text
        jsonschema.validate(json.loads(o.outputs[0].text), NUMBERS)
    assert len(set(texts(outs))) > 1
    assert_no_leaks(llm.engine)


def test_number_caps_keep_the_schemas_own_bounds_and_finite_values():
    from rawpage.structured_output.schema_rewrite import CAP, cap_numbers

    assert cap_numbers({"type": "integer", "minimum": 0}) == {"type": "integer", "minimum": 0, "maximum": CAP - 1}
    assert cap_numbers({"type": "integer", "minimum": 10**20}) == {"type": "integer", "minimum": 10**20}
    assert cap_numbers({"type": "integer", "const": 10**20}) == {"type": "integer", "const": 10**20}
    assert cap_numbers({"type": "number", "maximum": 1, "multipleOf": 0.5}) == {
        "type": "number",
        "maximum": 1,
        "multipleOf": 0.5,
        "exclusiveMinimum": -CAP,
    }
    nested = {"$defs": {"n": {"type": "integer"}}, "items": {"$ref": "#/$defs/n"}}
    assert cap_numbers(nested)["$defs"]["n"]["maximum"] == CAP - 1 and "maximum" not in nested["$defs"]["n"]


def test_a_choice_grammar_keeps_temperature_and_seed(llm):
    """issue 42 (vLLM's test_structured_outputs_choice_chat): the mask comes before the
    temperature, so a choice follows it: one answer greedy, several at temperature 2."""
    so = {"choice": ["red", "green", "blue", "yellow"]}

    def picks(t):
        p = [sampled(temperature=t, seed=s, max_tokens=8, structured_outputs=so) for s in range(16)]
        return set(texts(llm.generate([PROMPTS[0]] * 16, p, use_tqdm=False)))

    assert len(picks(0.0)) == 1 and len(picks(2.0)) > 1


OPEN_SCHEMA = {  # strings and arrays without maxLength / maxItems: a random model runs on in them
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "jobs": {
            "type": "array",
            "items": {"type": "object", "properties": {"company": {"type": "string"}}, "required": ["company"]},
        },
    },
    "required": ["name", "tags", "jobs"],
    "additionalProperties": False,
}


def test_unbounded_strings_close_before_max_tokens(llm):
    """Issue 42: a reply near max_tokens is made to write the grammar's shortest ending, so
    every reply parses; one that ends well before the limit is left alone."""
    for max_tokens in (40, 70, 100):
        params = [sampled(seed=s, max_tokens=max_tokens, structured_outputs={"json": OPEN_SCHEMA}) for s in range(6)]
        outs = llm.generate([PROMPTS[s % 6] for s in range(6)], params, use_tqdm=False)
        for o in outs:
            c = o.outputs[0]
            assert json.loads(c.text).keys() == {"name", "tags", "jobs"}, c.text
            assert c.finish_reason == "stop" and len(c.token_ids) <= max_tokens
    free = llm.generate(PROMPTS[0], sampled(seed=1, structured_outputs={"json": SCHEMA}), use_tqdm=False)[0]
    assert free.outputs[0].finish_reason == "stop" and len(free.outputs[0].token_ids) < 100
    assert_no_leaks(llm.engine)
