"""Tool calls that are always valid (issue 43 item 4): under tool_choice "auto" each
format's lazy grammar leaves free text free, and once the call tag is written holds
the call to a declared tool with arguments valid for its schema. Random logits (the
junk a model at temperature 1.0 may write) make valid calls with the grammar and
invalid ones without it."""

import copy
import json

import numpy as np
import pytest
from llguidance import LLMatcher

from rawpage import LLM, SamplingParams
from rawpage.server.args import ServerConfig
from rawpage.server.protocol import Body
from rawpage.server.tool_parsers.base import valid_call
from rawpage.server.tool_parsers.grammar import SpecialTokens
from rawpage.server.tools import tool_request_from
from tests.test_tool_formats import WEATHER as FORMATS_WEATHER

# test_tool_formats' get_weather, its values bounded: a random model ends every call
WEATHER = copy.deepcopy(FORMATS_WEATHER)
WEATHER["function"]["parameters"]["properties"].update(
    city={"type": "string", "enum": ["Paris", "Oslo"]}, days={"type": "integer", "minimum": 1, "maximum": 9}
)
WEATHER["function"]["parameters"]["required"] = ["city", "days"]
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}}},
    },
}
# the text a reply starts its call with, in each format (the tiny tokenizer has no special tokens)
TAGS = {
    "hermes": "Sure. <tool_call>",
    "qwen3_coder": "Sure. <tool_call>",
    "mistral": "Sure. [TOOL_CALLS]",
    "deepseek_v3": "Sure. <｜tool▁calls▁begin｜>",
    "llama3_json": "{",
    "pythonic": "[",
}


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(tiny_model_dir)


def auto(parser: str, grammar: bool = True, tokens=None):
    config = ServerConfig(enable_auto_tool_choice=True, tool_call_parser=parser, tool_call_grammar=grammar)
    return tool_request_from(Body({"tools": [WEATHER, TIME]}), config, None, tokens)


def check_call(request, text: str) -> None:
    """The reply's first call is a declared tool's, with arguments its schema allows."""
    call = valid_call(request.parser.scan(text, final=False).calls[0])
    assert call is not None, text
    args = json.loads(call.arguments)
    if call.name == "get_weather":
        assert args["city"] in ("Paris", "Oslo") and 1 <= args["days"] <= 9, text
        assert set(args) <= {"city", "days", "metric"} and isinstance(args.get("metric", True), bool), text
    else:
        assert call.name == "get_time" and set(args) <= {"tz"} and args.get("tz", "UTC") in ("UTC", "CET"), text


def allowed(matcher, vocab: int) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
    return np.flatnonzero(bits[:vocab])


@pytest.mark.parametrize("parser", sorted(TAGS))
def test_random_tokens_after_the_tag_make_a_valid_call(llm, parser):
    ll, vocab = llm.engine.grammars.ll_tokenizer, llm.engine.model_config.vocab_size
    request = auto(parser)
    matcher = LLMatcher(ll, LLMatcher.grammar_from_lark(request.constraint().grammar))
    assert not matcher.is_error(), matcher.get_error()
    assert matcher.is_accepting()  # an empty reply (EOS at once) is one
    if parser not in ("llama3_json", "pythonic"):  # free text is free: what any text may start with
        free = LLMatcher(ll, LLMatcher.grammar_from_lark("start: /(.|\\n)*/"))
        assert allowed(matcher, vocab).tolist() == allowed(free, vocab).tolist()
    text = TAGS[parser]
    assert matcher.consume_tokens(ll.tokenize_str(text)), matcher.get_error()
    rng = np.random.default_rng(0)
    for _ in range(3):  # three calls from random logits, each from the tag on
        m, raw = matcher.deep_copy(), text.encode()
        for _ in range(400):
            token = int(rng.choice(allowed(m, vocab)))
            assert m.consume_token(token)
            raw += ll.decode_bytes([token])
            out = raw.decode("utf-8", errors="ignore")  # a character split over tokens counts once whole
            scan = request.parser.scan(out, final=False)
            if scan.calls and scan.calls[0].done:
                break
        check_call(request, out)
        rng = np.random.default_rng(rng.integers(1 << 30))


def generate(llm, request, seeds: range) -> list[str]:
    """Replies at temperature 1.0 with the '{' token pushed up: the tiny random model then
    often starts a llama3_json call, and writes junk in it unless the grammar holds it."""
    tok = llm.get_tokenizer()
    brace = tok.encode("{", add_special_tokens=False)[0]
    params = [
        SamplingParams(
            temperature=1.0, max_tokens=96, seed=s, logit_bias={brace: 6.0}, structured_outputs=request.constraint()
        )
        for s in seeds
    ]
    outs = llm.generate([{"prompt_token_ids": list(range(5, 25))}] * len(params), params, use_tqdm=False)
    return [o.outputs[0].text for o in outs]


def test_the_tiny_model_writes_valid_calls_only_with_the_grammar(llm):
    free = [t for t in generate(llm, auto("llama3_json", grammar=False), range(12)) if t.startswith("{")]
    held = [t for t in generate(llm, auto("llama3_json"), range(12)) if t.startswith("{")]
    assert free and held
    assert all(auto("llama3_json").parser.parse(t)[1] == [] for t in free)  # junk: no call at all
    request = auto("llama3_json")
    for t in held:  # its first call (more may follow, until max_tokens)
        check_call(request, t)


def test_free_text_is_free_and_a_call_releases_it(llm):
    """With no call the grammar takes any text, and after a call text is free again."""
    ll = llm.engine.grammars.ll_tokenizer
    request = auto("hermes", tokens=SpecialTokens({}))
    grammar = LLMatcher.grammar_from_lark(request.constraint().grammar)
    for text in [
        "Just an answer, {with braces} and <tags>.",
        'Hi <tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call> and after it, free text.',
    ]:
        m = LLMatcher(ll, grammar)
        assert m.consume_tokens(ll.tokenize_str(text)), (text, m.get_error())
        assert m.is_accepting()
    m = LLMatcher(ll, grammar)
    bad = 'Hi <tool_call>\n{"name": "rm_rf", "arguments": {}}'
    assert not m.consume_tokens(ll.tokenize_str(bad))  # an undeclared tool cannot be written
