"""Issue 41 item 4, each check done once: every API's body is parsed once, in its parse
module, into a frozen typed request; handlers read that request and never the body; and
the engine checks a request once (LLMEngine.check_prompt), whose grammar future the
engine's add_request takes as it is, without looking it up again."""

import ast
import dataclasses
from pathlib import Path

import pytest

from rawpage import engine
from rawpage.engine_args import EngineArgs
from rawpage.server.args import ServerConfig
from rawpage.server.chat_input import parse_batch_chat, parse_chat_completion
from rawpage.server.messages_input import parse_count_tokens, parse_messages_request
from rawpage.server.prompt_input import parse_completion, parse_detokenize, parse_tokenize
from rawpage.server.protocol import APIError, Body
from rawpage.server.request import ChatRequest, parse_lora_adapter
from rawpage.server.responses_input import parse_responses
from rawpage.server.state import Caller
from rawpage.structured_output.grammar_compiler import GrammarCompiler
from tests.server.harness import in_process_app

SERVER = Path(__file__).resolve().parents[2] / "rawpage" / "server"
# The modules that read a request body (a Body): each API's parse, the shared fields, the
# JSON reader (protocol, state.read_body) and the readers of fields several APIs share.
PARSE_MODULES = {
    "protocol",  # Body: typed access to the JSON, and the sampling and output fields
    "state",  # read_body: the bytes read once, as JSON
    "request",  # the typed requests, and the fields every API reads alike
    "chat_input",
    "prompt_input",
    "responses_input",
    "messages_input",
    "infill_input",
    "reasoning_input",  # the reasoning controls each API spells its own way
    "guided",  # the output constraint's fields
    "tools",  # the tool fields
}
MSGS = [{"role": "user", "content": "hi"}]
USER = Caller(None, admin=True)  # a server without keys: its one user


@pytest.fixture(scope="module")
def app(tiny_model_dir):
    config = ServerConfig(allowed_hosts=["testserver"], max_tokens_default=4)
    with in_process_app(EngineArgs(model=tiny_model_dir, max_model_len=256), config) as (client, state):
        yield client, state


def parse_every_api(state) -> list:
    """One request of each API, parsed as its handler parses it."""
    return [
        parse_chat_completion(Body({"messages": MSGS, "logprobs": True, "stream": True}), state, "chatcmpl-1", USER),
        parse_batch_chat(Body({"messages": [MSGS, MSGS]}), state, "chatcmpl-2", USER),
        parse_completion(Body({"prompt": ["a", "b"], "echo": True}), state, "cmpl-1", USER),
        parse_responses(Body({"input": "hi", "instructions": "be brief"}), state, USER),
        parse_messages_request(Body({"messages": MSGS, "max_tokens": 4, "system": "be brief"}), state, USER),
        parse_count_tokens(Body({"messages": MSGS}), state, USER),
        parse_tokenize(Body({"messages": MSGS}), state, USER),
    ]


def test_each_api_parses_into_a_frozen_typed_request(app):
    _, state = app
    parsed = parse_every_api(state)
    for req in parsed:
        assert dataclasses.is_dataclass(req) and type(req).__dataclass_params__.frozen, type(req)
        field = dataclasses.fields(req)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(req, field, None)
    chat, batch, completion, responses, messages, count, _ = parsed
    # Chat, Responses and Messages share one part: the ChatRequest the run path reads.
    shared = [chat.chat, *(c.chat for c in batch.conversations), responses.chat, messages.chat, count]
    assert all(isinstance(c, ChatRequest) for c in shared)
    assert chat.output.stream and chat.chat.params.logprobs == 0 and chat.model == state.model_name
    assert responses.chat.messages[0] == {"role": "system", "content": "be brief"} and responses.chat.param == "input"
    assert messages.chat.messages[0]["role"] == "system" and messages.chat.params.max_tokens == 4
    assert completion.prompts == ("a", "b") and completion.echo
    assert parse_detokenize(Body({"tokens": [1, 2]}), state, USER) == [1, 2]


def test_parse_errors_keep_each_apis_shape(app):
    client, state = app
    with pytest.raises(APIError, match="'messages' must be a non-empty list"):
        parse_chat_completion(Body({"messages": []}), state, "chatcmpl-1", USER)
    with pytest.raises(APIError, match="LoRA adapters are off"):
        parse_lora_adapter(Body({"lora_name": "x"}), state, load=False)
    r = client.post("/v1/chat/completions", json={"messages": MSGS, "nonsense": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "nonsense"
    r = client.post("/v1/messages", json={"messages": MSGS})
    assert r.status_code == 400 and r.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
    }


def test_the_engine_checks_each_request_once_and_its_grammar_is_not_looked_up_again(app, monkeypatch):
    """The server's check (LLMEngine.check_prompt through EngineInfo, on the event loop) is
    the only one: the engine thread's add_request takes the CheckedPrompt and its grammar
    future as they are, checking nothing again and submitting no grammar again."""
    client, _ = app
    checks, submits = [], []
    check, submit = engine.check_request, GrammarCompiler.submit
    monkeypatch.setattr(engine, "check_request", lambda *a: checks.append(a[0]) or check(*a))
    monkeypatch.setattr(GrammarCompiler, "submit", lambda self, so: submits.append(so) or submit(self, so))
    schema = {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}
    requests = [
        ("/v1/chat/completions", {"messages": MSGS, "max_tokens": 3, "response_format": schema}, 1),
        ("/v1/completions", {"prompt": ["a", "b"], "max_tokens": 3, "guided_choice": ["x", "y"]}, 2),
        ("/v1/chat/completions/batch", {"messages": [MSGS, MSGS, MSGS], "max_tokens": 3}, 3),
        ("/v1/responses", {"input": "hi", "max_output_tokens": 3}, 1),
        ("/v1/messages", {"messages": MSGS, "max_tokens": 3}, 1),
    ]
    for path, body, prompts in requests:
        checks.clear(), submits.clear()
        r = client.post(path, json=body)
        assert r.status_code == 200, (path, r.text)
        assert len(checks) == prompts, (path, len(checks))  # once per prompt: not again in add_request
        constrained = "response_format" in body or "guided_choice" in body
        assert len(submits) == (prompts if constrained else 0), (path, submits)  # never looked up again


def test_a_bad_request_is_a_400_before_anything_streams(app):
    client, _ = app
    long = {"messages": [{"role": "user", "content": "hi " * 400}], "stream": True}
    r = client.post("/v1/chat/completions", json=long)
    assert r.status_code == 400 and "--max-model-len" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "messages"
    bad = {"messages": MSGS, "stream": True, "guided_regex": "(unclosed"}
    r = client.post("/v1/chat/completions", json=bad)
    assert r.status_code == 400 and r.json()["error"]["param"] == "structured_outputs"
    r = client.post("/v1/chat/completions", json={**long, "guided_regex": "(unclosed"})
    assert r.json()["error"]["param"] == "structured_outputs"  # the grammar's verdict first, as always
    r = client.post("/v1/responses", json={"input": "hi " * 400})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"


def parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


# What reading a body looks like: Body's getters, its dict, and a dict's own get.
BODY_READS = {name for name in vars(Body) if not name.startswith("_")} | {"data", "get"}


def body_reads(source: str) -> list[str]:
    """Where a module reads a request body: an import of Body, a Body getter (or .data, or
    .get) on a name `body`, or a read_body whose result goes anywhere but straight into
    invocation_kind (a parse goes through ServerState.parse, which takes a large body's
    off the event loop)."""
    tree = ast.parse(source)
    up = parents(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(a.name == "Body" for a in node.names):
            found.append(f"line {node.lineno}: imports Body")
        elif isinstance(node, ast.Attribute) and getattr(node.value, "id", "") == "body" and node.attr in BODY_READS:
            found.append(f"line {node.lineno}: body.{node.attr}")
        elif isinstance(node, ast.Attribute) and node.attr == "read_body":
            call = up[node]
            outer = up.get(up.get(call))  # read_body(...) -> await -> the call it is an argument of
            name = getattr(getattr(outer, "func", None), "id", "")
            if not (isinstance(outer, ast.Call) and name == "invocation_kind"):
                found.append(f"line {node.lineno}: read_body's result is kept or parsed, not through state.parse")
    return found


def test_handlers_never_read_the_body():
    """Outside the parse modules, no server module holds a Body: each handler has its API's
    parse function read the body (state.parse) and reads the typed request."""
    handlers = sorted(p for p in SERVER.glob("*.py") if p.stem not in PARSE_MODULES)
    assert {"chat", "chat_batch", "completions", "responses", "messages", "embeddings", "app"} <= {
        p.stem for p in handlers
    }
    reads = {p.stem: body_reads(p.read_text()) for p in handlers}
    assert not {k: v for k, v in reads.items() if v}, reads
    # The check sees what it looks for.
    assert len(body_reads("async def f(r, state):\n    body = await state.read_body(r)\n    body.get('x')\n")) == 2
    assert body_reads("def f(body):\n    return body.data['messages']\n")
    assert not body_reads("def f(body: str):\n    return body.strip()\n")  # a text named body is no body
    assert body_reads("from rawpage.server.protocol import APIError, Body\n")
    assert body_reads("async def f(r, state):\n    return parse_chat(await state.read_body(r), state)\n")
    assert not body_reads("async def f(r, state):\n    return await state.parse(r, parse_chat)\n")
