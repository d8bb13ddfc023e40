"""Thinking budgets in the engine (issue 43 item 1): once a think block has used its
budget, the end tag is forced token by token and the answer follows; the block's tokens
are counted. A tiny random model with <think> and </think> as single tokens and a
Qwen3-style template (tests/tiny_models.py) thinks for as long as it is let."""

import pytest

from rawpage import LLM, SamplingParams
from rawpage.structured_output.reasoning_gate import MAYBE, THINKING, ReasoningGate
from rawpage.thinking_budget import ThinkingBudget
from tests.tiny_models import write_thinking_model

USER = [{"role": "user", "content": "hi"}]
TAGS = ("<think>", "</think>")


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return LLM(write_thinking_model(str(tmp_path_factory.mktemp("think") / "m")), max_model_len=256)


def ids(llm, text):
    return llm.engine.tokenizer.encode(text, add_special_tokens=False)


def run(llm, messages=USER, **kw):
    params = SamplingParams(**{"temperature": 0, "max_tokens": 20, "ignore_eos": True, **kw})
    return llm.chat(messages, params, use_tqdm=False)[0].outputs[0]


@pytest.mark.parametrize("budget", [0, 1, 5, 12])
def test_the_end_tag_is_forced_when_the_budget_is_spent(llm, budget):
    (end,) = ids(llm, "</think>")
    free = run(llm, reasoning_tags=TAGS)
    assert end not in free.token_ids and free.reasoning_tokens == 20  # left alone, it never stops thinking
    out = run(llm, thinking_token_budget=budget)
    assert out.token_ids[budget] == end and end not in out.token_ids[:budget]
    assert out.token_ids[:budget] == free.token_ids[:budget]  # the thinking before it is the model's own
    assert out.reasoning_tokens == budget + 1  # the block's tokens, the forced tag included
    assert out.text.count("</think>") == 1


def test_a_prompt_that_closes_the_block_counts_no_reasoning(llm):
    closed = "{% for m in messages %}{{ m['content'] }}{% endfor %}<think>\n\n</think>\n\n"
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, thinking_token_budget=2)
    out = llm.chat(USER, params, use_tqdm=False, chat_template=closed)[0].outputs[0]
    assert out.reasoning_tokens == 0 and "</think>" not in out.text


def test_a_model_that_opens_the_block_itself_is_held_to_the_budget(llm):
    """No block in the prompt (MAYBE): the model's own <think> opens one, counted from there."""
    plain = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (start,) = ids(llm, "<think>")
    (end,) = ids(llm, "</think>")
    params = SamplingParams(
        temperature=0, max_tokens=12, ignore_eos=True, thinking_token_budget=3, logit_bias={start: 100.0}
    )
    out = llm.chat(USER, params, use_tqdm=False, chat_template=plain)[0].outputs[0]
    assert out.token_ids[0] == start and out.token_ids[4] == end  # <think>, 3 tokens, </think>
    assert out.reasoning_tokens == 5


def test_n_samples_and_a_grammar_keep_their_budgets(llm):
    outs = llm.chat(
        USER,
        SamplingParams(n=3, temperature=1.0, seed=2, max_tokens=16, ignore_eos=True, thinking_token_budget=4),
        use_tqdm=False,
    )[0].outputs
    (end,) = ids(llm, "</think>")
    assert len({tuple(o.token_ids) for o in outs}) > 1
    assert all(o.token_ids[4] == end and o.reasoning_tokens == 5 for o in outs)
    so = {"choice": ["yes", "no"], "reasoning": TAGS}
    out = run(llm, thinking_token_budget=2, structured_outputs=so, ignore_eos=False)
    assert out.token_ids[2] == end and out.text.split("</think>")[1] in ("yes", "no")


def test_a_multi_token_end_tag_is_forced_piece_by_piece():
    """A vocabulary that spells </think> in several tokens: each is forced in turn."""
    texts = {0: "a", 1: "</", 2: "think", 3: ">", 4: "<think>"}

    class Texts:
        def text(self, t):
            return texts[t]

    budget = ThinkingBudget(ReasoningGate(TAGS, THINKING, Texts()), 2, [1, 2, 3])
    forced = []
    for _ in range(6):
        t = budget.forced_token()
        forced.append(t)
        budget.accept(0 if t is None else t)
    assert forced == [None, None, 1, 2, 3, None]
    assert budget.num_thinking == 2 and budget.num_reasoning_tokens == 5 and not budget.may_force
    child = ThinkingBudget(ReasoningGate(TAGS, MAYBE, Texts()), 0, [1, 2, 3])
    child.accept(4)  # the model opens the block: budget 0 closes it at once
    assert child.forced_token() == 1


def test_bad_budgets_are_refused():
    with pytest.raises(ValueError, match="thinking_token_budget"):
        SamplingParams(thinking_token_budget=-2)
    with pytest.raises(ValueError, match="beam search"):
        SamplingParams(thinking_token_budget=3, use_beam_search=True, n=2, temperature=0)
    assert SamplingParams(thinking_token_budget=-1).thinking_token_budget is None  # llama-server's unlimited


def test_speculative_decoding_waits_for_the_block_to_close(llm, tmp_path):
    """A sequence whose next token may be forced drafts nothing; greedy output is unchanged."""
    spec = LLM(
        write_thinking_model(str(tmp_path / "m")),
        max_model_len=256,
        speculative_config={"method": "ngram", "num_speculative_tokens": 3},
    )
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, thinking_token_budget=6)
    want = llm.chat(USER, params, use_tqdm=False)[0].outputs[0]
    got = spec.chat(USER, params, use_tqdm=False)[0].outputs[0]
    assert got.token_ids == want.token_ids and got.reasoning_tokens == want.reasoning_tokens == 7
