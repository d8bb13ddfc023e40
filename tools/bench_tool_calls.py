"""How many of a model's tool calls are invalid, with and without the tool-call grammar
(issue 43 item 4).

Samples `--tries` replies at temperature 1.0 to a prompt that offers two tools under
tool_choice "auto", through the server's own pieces (the chat template with the tools,
the --tool-call-parser, the lazy grammar), and counts the replies that start a call
(the parser's tag appears; for llama3_json and pythonic, whose call is the whole
reply, the reply starts with "{" or "[") and of those the ones whose first call is invalid: malformed,
not closed within --max-tokens, a tool that was not declared, or arguments that break
the tool's schema. `--bias-tag` adds a
logit bias to the tag's first token (`--bias-all`: to each of its tokens), so that a
model that seldom calls tools (the default model at this size, the tiny random test
model never) tries often; inside a call the bias pulls toward junk, which is the test.

    python tools/bench_tool_calls.py --bias-tag 6          # the default model, hermes
    python tools/bench_tool_calls.py --tiny --parser llama3_json --bias-tag 6
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository, for --tiny

from rawpage import LLM, SamplingParams
from rawpage.server.args import ServerConfig
from rawpage.server.protocol import Body
from rawpage.server.tool_parsers import TOOL_PARSERS
from rawpage.server.tool_parsers.base import Malformed, valid_call
from rawpage.server.tool_parsers.grammar import SpecialTokens
from rawpage.server.tools import template_for_tools, tool_request_from

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather forecast for a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 40},
                    "days": {"type": "integer", "minimum": 1, "maximum": 14},
                },
                "required": ["city", "days"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The current time in a time zone",
            "parameters": {
                "type": "object",
                "properties": {"tz": {"type": "string", "enum": ["UTC", "CET", "PST"]}},
                "required": ["tz"],
            },
        },
    },
]
CALL_STARTS = {"llama3_json": "{", "llama4_json": "{", "pythonic": "[", "llama4_pythonic": "["}
MESSAGES = [{"role": "user", "content": "What will the weather be in Paris for the next 3 days? Use the tools."}]


def schema_errors(value: object, schema: dict) -> list[str]:
    """The ways `value` breaks this (small) JSON schema: type, enum, bounds, required, extra keys."""
    kind = schema.get("type")
    types = {"object": dict, "string": str, "integer": int, "number": (int, float), "boolean": bool}
    if kind in types and (not isinstance(value, types[kind]) or (kind != "boolean" and isinstance(value, bool))):
        return [f"{value!r} is not {kind}"]
    errors = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{value!r} not in {schema['enum']}")
    if isinstance(value, str) and len(value) > schema.get("maxLength", len(value)):
        errors.append("string too long")
    if isinstance(value, int) and not schema.get("minimum", value) <= value <= schema.get("maximum", value):
        errors.append(f"{value} out of range")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        errors += [f"missing {k}" for k in schema.get("required", []) if k not in value]
        errors += [f"undeclared {k}" for k in value if k not in props]
        errors += [e for k, v in value.items() if k in props for e in schema_errors(v, props[k])]
    return errors


def first_call_problem(text: str, request) -> str | None:
    """Why the reply's first call is not a valid call of a declared tool (None when it is).
    A call still open when max_tokens ended the reply counts: it is no call either."""
    try:
        drafts = request.parser.scan(text, final=False).calls
    except Malformed:
        return "malformed"
    if not drafts or not drafts[0].done:
        return "not closed within max_tokens"
    call = valid_call(drafts[0])
    if call is None:
        return "arguments are not a JSON object"
    fn = request.functions.get(call.name)
    if fn is None:
        return f"undeclared tool {call.name!r}"
    errors = schema_errors(json.loads(call.arguments), fn["parameters"])
    return f"{call.name}: {errors[0]}" if errors else None


def run(llm: LLM, parser: str, grammar: bool, tries: int, bias: float, bias_all: bool, max_tokens: int) -> dict:
    tok = llm.get_tokenizer()
    config = ServerConfig(enable_auto_tool_choice=True, tool_call_parser=parser, tool_call_grammar=grammar)
    request = tool_request_from(Body({"tools": TOOLS}), config, None, SpecialTokens.of(tok))
    template = template_for_tools(llm.engine.chat_template or tok.chat_template)
    prompt = tok.apply_chat_template(MESSAGES, True, chat_template=template, tools=TOOLS)
    tag = CALL_STARTS.get(parser) or TOOL_PARSERS[parser].template_marks[0]
    end = getattr(TOOL_PARSERS[parser], "END", None) if parser not in CALL_STARTS else None
    tag_ids = tok.encode(tag, add_special_tokens=False)
    bias_map = {t: bias for t in (tag_ids if bias_all else tag_ids[:1])} if bias else None
    params = [
        SamplingParams(
            temperature=1.0,
            max_tokens=max_tokens,
            seed=seed,
            logit_bias=bias_map,
            skip_special_tokens=not request.keeps_special_tokens(),
            stop=[end] if end else None,  # only the first call is judged: stop once it has closed
            include_stop_str_in_output=True,
            structured_outputs=request.constraint(),
        )
        for seed in range(tries)
    ]
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": tok.encode(prompt, add_special_tokens=False)}] * tries, params)
    whole = parser in CALL_STARTS  # formats whose call is the whole reply: a reply that starts like one
    attempted = [
        t for o in outs if (t := o.outputs[0].text).lstrip(" \t\r\n").startswith(tag) or (not whole and tag in t)
    ]
    reasons = [r for t in attempted if (r := first_call_problem(t, request))]
    return {
        "grammar": grammar,
        "tries": tries,
        "attempted": len(attempted),  # replies that wrote the call tag
        "invalid": len(reasons),  # of those, replies whose first call is not a valid call
        "seconds": round(time.perf_counter() - start, 1),
        "examples": reasons[:3],
    }


def tiny_model(folder: str) -> str:
    """The tests' tiny random Llama (tests/conftest.py's tiny_model_dir), written to `folder`."""
    from tests.tiny_models import TINY_LLAMA, random_tensors, tiny_config, train_tokenizer, write_hf_folder

    cfg = tiny_config(**TINY_LLAMA)
    return write_hf_folder(os.path.join(folder, "hf"), cfg, random_tensors(cfg, seed=1), train_tokenizer())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a model folder or GGUF (default: rawpage's default model)")
    ap.add_argument("--tiny", action="store_true", help="the tests' tiny random model (tests/tiny_models.py)")
    ap.add_argument("--parser", default="hermes", choices=list(TOOL_PARSERS))
    ap.add_argument("--tries", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--bias-tag", type=float, default=0.0, help="logit bias on the call tag's first token")
    ap.add_argument("--bias-all", action="store_true", help="put --bias-tag on every token of the tag")
    args = ap.parse_args()
    llm = LLM(tiny_model(tempfile.mkdtemp())) if args.tiny else LLM(args.model) if args.model else LLM()
    for grammar in (False, True):
        print(
            json.dumps(run(llm, args.parser, grammar, args.tries, args.bias_tag, args.bias_all, args.max_tokens)),
            flush=True,
        )


if __name__ == "__main__":
    main()
