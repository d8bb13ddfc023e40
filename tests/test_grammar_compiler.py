"""Grammar compilation off the engine thread (issue 29, items 1 and 2): the gate, the
validator child, the matcher cache, and a sequence waiting for its grammar.

Each test here failed before that change: grammars were compiled on the engine thread
per request and per prompt, an llguidance crash took the process down, and a grammar
in its error state ended with a valid-looking "stop"."""

import threading
import time

import pytest

from rawpage import LLM, SamplingParams
from rawpage.engine import LLMEngine
from rawpage.engine_args import EngineArgs
from rawpage.errors import InvalidRequestError
from rawpage.structured_output import StructuredOutputsParams
from rawpage.structured_output.grammar_compiler import GrammarCompiler, MatcherCache
from rawpage.structured_output.grammar_limits import GrammarLimits
from tests.model_harness import assert_no_leaks

PROMPT = {"prompt_token_ids": list(range(5, 25))}


def ref_chain(n: int) -> dict:
    """A JSON schema whose $defs form a chain of n $refs, each through `properties`: only a
    few levels of JSON deep, but llguidance recurses once per link (about 950 kill it)."""
    defs = {f"d{i}": {"type": "object", "properties": {"next": {"$ref": f"#/$defs/d{i + 1}"}}} for i in range(n)}
    defs[f"d{n}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def lark_chain(n: int) -> str:
    """n Lark rules, each calling the next (about 2,800 kill llguidance)."""
    return "start: r0\n" + "\n".join(f"r{i}: r{i + 1}" for i in range(n)) + f'\nr{n}: "x"'


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(tiny_model_dir)


def compiler(llm, **limits) -> GrammarCompiler:
    """A fresh compiler (empty cache) for the tiny model, with some limits changed."""
    eng = llm.engine
    args = EngineArgs(**limits)
    return GrammarCompiler(
        eng.tokenizer.hf, eng.model_config.vocab_size, eng.model_config.eos_token_ids, limits_of(args)
    )


def limits_of(args: EngineArgs) -> GrammarLimits:
    return GrammarLimits.from_args(args)


# --- the gate -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "so, flag",
    [
        ({"json": ref_chain(257)}, "--max-grammar-refs"),
        ({"grammar": lark_chain(1000)}, "--max-grammar-rules"),
        ({"choice": [f"c{i}" for i in range(4097)]}, "--max-grammar-choices"),
        ({"json": {"enum": list(range(4097))}}, "--max-grammar-choices"),
        ({"regex": "a" * (256 * 1024 + 1)}, "--max-grammar-bytes"),
    ],
)
def test_each_limit_refuses_before_llguidance_and_names_its_flag(llm, so, flag):
    gc = compiler(llm)
    with pytest.raises(InvalidRequestError, match=flag) as e:
        gc.check(StructuredOutputsParams(**so))
    assert e.value.param == "structured_outputs"
    assert gc.num_compiles == 0


def test_just_under_the_limits_compiles(llm):
    gc = compiler(llm)
    for so in ({"json": ref_chain(255)}, {"grammar": lark_chain(990)}, {"choice": [f"c{i}" for i in range(4096)]}):
        gc.submit(StructuredOutputsParams(**so)).result(timeout=60)
    assert gc.num_compiles == 3


# --- the validator child --------------------------------------------------------------------


@pytest.mark.parametrize("so", [{"json": ref_chain(1000)}, {"grammar": lark_chain(3000)}])
def test_a_grammar_that_crashes_llguidance_kills_only_the_child(llm, so):
    """With the gate opened wide, the crash happens in the validator child: a refusal,
    and the next grammar is validated by a fresh child."""
    gc = compiler(llm, max_grammar_refs=10**6, max_grammar_rules=10**6)
    with pytest.raises(InvalidRequestError, match="too complex for the grammar compiler") as e:
        gc.submit(StructuredOutputsParams(**so)).result(timeout=60)
    assert "crashed" in str(e.value) and "--max-grammar-refs" in str(e.value)
    gc.submit(StructuredOutputsParams(choice=["yes", "no"])).result(timeout=60)
    assert gc.num_compiles == 1


def test_validation_past_the_timeout_is_refused_and_the_child_replaced(llm):
    gc = compiler(llm, max_grammar_choices=10**6, max_grammar_bytes="8MiB", grammar_compile_timeout=0.05)
    gc.submit(StructuredOutputsParams(choice=["warm"])).result(timeout=60)  # the child's start is not timed
    slow = StructuredOutputsParams(choice=[f"item number {i}" for i in range(40_000)])
    with pytest.raises(InvalidRequestError, match="--grammar-compile-timeout"):
        gc.submit(slow).result(timeout=60)
    gc.submit(StructuredOutputsParams(choice=["after"])).result(timeout=60)


# --- the cache ------------------------------------------------------------------------------


def test_the_matcher_cache_is_bounded_and_adds_each_key_once_across_threads():
    cache = MatcherCache(8)
    start = threading.Barrier(8)

    def hammer(t: int) -> None:
        start.wait()
        for i in range(400):
            cache.get_or_add(f"k{(i * 7 + t) % 8}" if i % 2 else f"other{t}-{i}")
            assert len(cache) <= 8

    threads = [threading.Thread(target=hammer, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(cache) <= 8
    # Under eviction a key may be added again, but never twice while it is cached:
    cache = MatcherCache(4)
    results = []
    barrier = threading.Barrier(16)

    def same() -> None:
        barrier.wait()
        results.append(cache.get_or_add("one"))

    threads = [threading.Thread(target=same) for _ in range(16)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sum(new for _, new in results) == 1 and len({id(f) for f, _ in results}) == 1


def test_128_prompts_with_one_grammar_compile_it_once(llm):
    so = StructuredOutputsParams(choice=["alpha", "beta", "gamma-128"])
    before = llm.engine.grammars.num_compiles
    prompts = [{"prompt_token_ids": [5 + i % 50, 6, 7]} for i in range(128)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=24, structured_outputs=so), use_tqdm=False)
    assert llm.engine.grammars.num_compiles - before == 1
    assert {o.outputs[0].text for o in outs} <= {"alpha", "beta", "gamma-128"}


# --- the engine: a sequence waits for its grammar -------------------------------------------


def test_a_sequence_waits_for_its_grammar_while_others_run(llm, monkeypatch):
    eng: LLMEngine = llm.engine
    release = threading.Event()
    build = type(eng.grammars)._build

    def slow_build(self, grammar):
        release.wait(30)
        return build(self, grammar)

    monkeypatch.setattr(type(eng.grammars), "_build", slow_build)
    so = StructuredOutputsParams(choice=["only-this-one"])
    eng.add_request("constrained", PROMPT, SamplingParams(max_tokens=30, structured_outputs=so))
    eng.add_request("free", PROMPT, SamplingParams(max_tokens=6, ignore_eos=True))
    done = {}
    for _ in range(20):
        for out in eng.step():
            done[out.request_id] = out if out.finished else None
        if "free" in done and done["free"] is not None:
            break
    assert done["free"] is not None and "constrained" not in done  # never scheduled while compiling
    (seq,) = eng.requests["constrained"].seqs
    assert seq in eng.scheduler.waiting and seq.num_computed_tokens == 0
    release.set()
    deadline = time.monotonic() + 60
    while eng.has_unfinished_requests() and time.monotonic() < deadline:
        for out in eng.step():
            done[out.request_id] = out
    assert done["constrained"].outputs[0].text == "only-this-one"
    assert_no_leaks(eng)


def test_a_grammar_failing_after_add_request_fails_the_request_not_a_silent_stop(llm):
    """LLMEngine used directly: nobody validated the grammar before add_request."""
    eng: LLMEngine = llm.engine
    so = StructuredOutputsParams(grammar="start: undefined_rule")
    eng.add_request("bad-grammar", PROMPT, SamplingParams(max_tokens=4, structured_outputs=so))
    outs = []
    deadline = time.monotonic() + 60
    while eng.has_unfinished_requests() and time.monotonic() < deadline:
        outs += [o for o in eng.step() if o.request_id == "bad-grammar"]
    (final,) = [o for o in outs if o.finished]
    assert final.error and "undefined_rule" in final.error
    assert [c.finish_reason for c in final.outputs] == ["abort"]
    assert_no_leaks(eng)


def test_a_grammar_in_its_error_state_ends_length_and_is_flagged(llm):
    eng: LLMEngine = llm.engine
    so = StructuredOutputsParams(regex="[ab]+")
    p = SamplingParams(max_tokens=40, temperature=1.0, seed=1, structured_outputs=so)
    eng.add_request("broken", PROMPT, p)
    while not eng.requests["broken"].seqs[0].output_token_ids:
        eng.step()
    (seq,) = eng.requests["broken"].seqs
    bad = eng.tokenizer.encode("zzzz", add_special_tokens=False)[0]
    seq.grammar.matcher.consume_token(bad)  # what a refused token would do: the error state
    final = None
    while eng.has_unfinished_requests():
        final = next((o for o in eng.step() if o.request_id == "broken" and o.finished), final)
    (out,) = final.outputs
    assert out.finish_reason == "length" and out.grammar_error, out
    assert len(out.token_ids) < 40
    assert_no_leaks(eng)
