"""The reasoning gate (issue 29 item 3): a grammar constrains the answer outside the
think block, from the first token when the model does not think, and the end tag is
found in the decoded text however it was tokenized. A fake tokenizer and matcher keep
the logic in plain sight."""

import ctypes
from concurrent.futures import Future

import numpy as np
import pytest

from rawpage.structured_output import GrammarState
from rawpage.structured_output.reasoning_gate import MAYBE, OPEN, THINKING, ReasoningGate, TokenTexts, prompt_phase

VOCAB = [
    "<",
    "think",
    ">",
    "</",
    "</think>",
    "<think>",
    "{",
    "}",
    "a",
    "<th",
    "ink>",
    "\n",
    "<eos>",
    "th",
    "ink",
    "think>",
]
ID = {s: i for i, s in enumerate(VOCAB)}
TAGS = ("<think>", "</think>")
WORDS = 1


def decode(ids):
    return "".join(VOCAB[i] for i in ids)


class FakeMatcher:
    """A grammar that takes "{", "a" and "}" in any order, then EOS."""

    ALLOWED = {ID["{"], ID["a"], ID["}"], ID["<eos>"]}

    def __init__(self):
        self.consumed, self.failed = [], False

    def consume_token(self, t):
        self.consumed.append(t)
        self.failed = self.failed or t not in self.ALLOWED
        return not self.failed

    def is_error(self):
        return self.failed

    def get_error(self):
        return "refused" if self.failed else ""

    def deep_copy(self):
        m = FakeMatcher()
        m.consumed, m.failed = list(self.consumed), self.failed
        return m

    def unsafe_compute_mask_ptr(self, ptr, nbytes):
        row = np.ctypeslib.as_array((ctypes.c_int32 * (nbytes // 4)).from_address(ptr))
        row[:] = 0 if self.failed else _bits(self.ALLOWED)[0]


class FakeCompiled:
    def fresh(self):
        return FakeMatcher()


class FakeCompiler:
    eos_token_ids = [ID["<eos>"]]
    closer = None  # no length look-ahead: these masks are asked without a budget
    words = WORDS


def _bits(ids):
    bits = np.zeros(32 * WORDS, dtype=bool)
    bits[list(ids)] = True
    return np.packbits(bits, bitorder="little").view(np.int32)


def _allowed(row):
    return {VOCAB[i] for i in np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")) if i < len(VOCAB)}


def state(phase):
    fut = Future()
    fut.set_result(FakeCompiled())
    texts = TokenTexts(lambda ids: [VOCAB[i] for i in ids], len(VOCAB), WORDS)
    return GrammarState(FakeCompiler(), fut, ReasoningGate(TAGS, phase, texts) if phase != OPEN else None)


def feed(st, *tokens):
    for t in tokens:
        st.accept(ID[t])


def mask(st):
    row = st.mask()
    return _allowed(row) if row is not None else None


@pytest.mark.parametrize(
    "prompt, phase",
    [
        ("user: hi\nassistant:", MAYBE),  # no think block: the model may open one
        ("user: hi\nassistant: <think>\n", THINKING),  # the template opened it (DeepSeek-R1, Qwen3-Thinking)
        ("user: hi\nassistant: <think>\n\n</think>\n\n", OPEN),  # enable_thinking: false closed it
        ("<think>old</think> done\nuser: hi\nassistant:", MAYBE),  # an earlier turn's block
    ],
)
def test_the_prompt_decides_the_first_phase(prompt, phase):
    assert prompt_phase(lambda ids: bytes(ids).decode(), list(prompt.encode()), TAGS) == phase


@pytest.mark.parametrize(
    "end_tokens",
    [["</think>"], ["</", "think", ">"], ["</", "th", "ink", ">"], ["</", "th", "ink>"]],
)
def test_the_end_tag_is_found_however_it_is_tokenized(end_tokens):
    st = state(THINKING)
    feed(st, "a", "\n")
    assert mask(st) is None and st.matcher is None  # thinking: free
    feed(st, *end_tokens)
    assert st.gate.phase == OPEN and mask(st) == {"{", "a", "}", "<eos>"}
    feed(st, "{", "}")
    assert st.matcher.consumed == [ID["{"], ID["}"]]  # a fresh matcher, from after the tag


def test_a_model_that_does_not_think_is_constrained_from_its_first_token():
    st = state(MAYBE)
    # the grammar's tokens, and a whole start tag; never "<", which would lead a model
    # about to write "<tool_call>" into a think block piece by piece
    assert mask(st) == {"{", "a", "}", "<eos>", "<think>"}
    feed(st, "{")
    assert st.gate.phase == OPEN and mask(st) == {"{", "a", "}", "<eos>"}
    assert st.matcher.consumed == [ID["{"]] and st.error is None


def test_a_model_that_opens_a_block_thinks_freely_then_answers_in_the_grammar():
    st = state(MAYBE)
    feed(st, "<think>")
    assert st.gate.phase == THINKING and mask(st) is None
    feed(st, "a", "<", "}", "</", "think>")
    assert st.gate.phase == OPEN and st.error is None
    feed(st, "a")
    assert st.matcher.consumed == [ID["a"]]


def test_a_fork_keeps_each_branch_apart():
    st = state(MAYBE)
    feed(st, "<think>", "a")
    child = st.fork()
    feed(child, "</think>", "{")
    assert st.gate.phase == THINKING and st.matcher is None
    assert child.gate.phase == OPEN and child.matcher.consumed == [ID["{"]]
