"""Issue 29, items 1 and 2, replayed against real servers: a grammar that crashes
llguidance is a 400 and the server lives; each grammar limit is a 400 naming its flag;
a slow grammar compiles off the engine thread, once, while other streams keep going.

Before the fix, the crash cases killed the server (SIGSEGV, no log line), and a slow
grammar stalled every stream for as long as it compiled."""

import json
import statistics
import threading
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server.harness import ServerProcess
from tests.server.test_errors import assert_error
from tests.test_grammar_compiler import lark_chain, ref_chain

CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
MSGS = [{"role": "user", "content": "hi"}]


def alive(server) -> None:
    assert server.proc.poll() is None, server.output()
    assert httpx.get(server.url + "/health").status_code == 200
    r = httpx.post(server.url + CMPL, json={"prompt": "Hi", "max_tokens": 2, "guided_choice": ["yes", "no"]})
    assert r.status_code == 200, r.text


def crash_bodies() -> list[tuple[str, dict]]:
    """The three ways in: a response_format schema, a named tool's parameters, a Lark grammar."""
    chain = ref_chain(1000)  # ~70 KB, 6 levels of JSON: the depth check passes it
    tool = {"type": "function", "function": {"name": "f", "parameters": chain}}
    return [
        (CHAT, {"messages": MSGS, "response_format": {"type": "json_schema", "json_schema": {"schema": chain}}}),
        (CHAT, {"messages": MSGS, "tools": [tool], "tool_choice": {"type": "function", "function": {"name": "f"}}}),
        (CMPL, {"prompt": "hi", "guided_grammar": lark_chain(3000)}),
    ]


@pytest.mark.parametrize("path,body", crash_bodies())
def test_grammars_that_crash_llguidance_are_400s_at_the_gate(server, path, body):
    assert_error(httpx.post(server.url + path, json={**body, "max_tokens": 4}, timeout=60), 400, "structured_outputs")
    alive(server)


@pytest.fixture(scope="module")
def open_gate():
    """Limits raised far past llguidance's crash thresholds: only the validator child stands."""
    wide = ["--max-grammar-refs", "100000", "--max-grammar-rules", "100000", "--max-grammar-choices", "100000"]
    s = ServerProcess(*wide, "--max-grammar-bytes", "8MiB", "--max-model-len", "2048")
    yield s
    assert s.stop() == 0, s.output()


@pytest.mark.parametrize("path,body", crash_bodies())
def test_past_the_gate_a_crash_kills_only_the_validator_child(open_gate, path, body):
    r = httpx.post(open_gate.url + path, json={**body, "max_tokens": 4}, timeout=60)
    assert_error(r, 400, "structured_outputs", "too complex for the grammar compiler")
    alive(open_gate)


# --- each limit: a 400 naming its flag ------------------------------------------------------


@pytest.mark.parametrize(
    "body,flag",
    [
        ({"guided_json": ref_chain(257)}, "--max-grammar-refs"),
        ({"guided_grammar": lark_chain(1000)}, "--max-grammar-rules"),
        ({"guided_choice": [f"c{i}" for i in range(4097)]}, "--max-grammar-choices"),
        ({"guided_json": {"enum": [f"c{i}" for i in range(4097)]}}, "--max-grammar-choices"),
        ({"guided_regex": "a" * (256 * 1024 + 1)}, "--max-grammar-bytes"),
    ],
)
def test_each_grammar_limit_is_a_400_naming_its_flag(server, body, flag):
    r = httpx.post(server.url + CMPL, json={"prompt": "hi", "max_tokens": 2, **body}, timeout=60)
    assert_error(r, 400, "structured_outputs", flag)


# --- compiled once, off the engine thread ---------------------------------------------------


def test_128_prompts_with_one_grammar_compile_it_once(server):
    choices = ["north-128", "south-128"]  # a grammar no other test sends
    before = server.output().count("grammar compiled:")
    body = {"prompt": [f"Point {i}:" for i in range(128)], "max_tokens": 6, "guided_choice": choices}
    r = httpx.post(server.url + CMPL, json=body, timeout=300)
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 128
    assert server.output().count("grammar compiled:") - before == 1


def test_a_slow_grammar_does_not_stall_other_streams(open_gate):
    """One client streams; another sends a 40,000-item choice (seconds to compile). The
    first client's token gaps meanwhile stay near its own baseline: the compile runs on
    the compiler's threads and in the validator child, not on the engine thread."""
    url = open_gate.url
    httpx.post(url + CMPL, json={"prompt": "hi", "max_tokens": 1, "guided_choice": ["warm"]}, timeout=60)
    stamps: list[float] = []
    compiled: list[float] = []  # when the slow request came back

    def stream() -> None:
        # as long as the context allows, and closed (a disconnect) 30 tokens after the
        # compile: at ~5 ms a token a fixed length could end before the compile does
        body = {"prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url + CMPL, json=body, timeout=300) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    stamps.append(time.monotonic())
                    if compiled and sum(t > compiled[0] for t in stamps[-30:]) == 30:
                        return

    reader = threading.Thread(target=stream)
    reader.start()
    while len(stamps) < 30:
        time.sleep(0.01)
    slow = {"prompt": "hi", "max_tokens": 1, "guided_choice": [f"item number {i}" for i in range(40_000)]}
    t0 = time.monotonic()
    r = httpx.post(url + CMPL, json=slow, timeout=300)
    t1 = time.monotonic()
    compiled.append(t1)
    reader.join()
    assert r.status_code == 200, r.text
    gaps = [(b - a, a) for a, b in zip(stamps, stamps[1:])]
    baseline = statistics.median(g for g, at in gaps if at < t0)
    during = max(g for g, at in gaps if t0 <= at <= t1)
    assert stamps[-1] > t1, "the stream ended before the slow grammar was compiled"
    # Stalled, the stream would wait out the whole compile (seconds: 9.2 s in the issue's
    # report). The bound allows the scheduling noise of a loaded 2-core machine, where a
    # decode step is ~10 ms and one gap of a few hundred ms happens (0.45 s was seen).
    assert during < max(10 * baseline, 0.2 * (t1 - t0)), (during, baseline, t1 - t0)


# --- fuzz: never a 500, never a crash -------------------------------------------------------

leaf = st.sampled_from([{"type": "integer"}, {"type": "string"}, {"type": "boolean"}, {"enum": ["a", "b", 1]}])
schemas = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.builds(lambda p: {"type": "object", "properties": p}, st.dictionaries(st.text(min_size=1), inner)),
        st.builds(lambda i: {"type": "array", "items": i}, inner),
        st.builds(lambda a: {"anyOf": a}, st.lists(inner, min_size=1, max_size=4)),
        st.builds(lambda r: {"$ref": r}, st.sampled_from(["#/$defs/x", "#", "#/nope", "bogus"])),
    ),
    max_leaves=20,
)
bodies = st.one_of(
    st.builds(lambda s: {"guided_json": s}, schemas),
    st.builds(lambda s: {"guided_json": {"$defs": {"x": s}, "$ref": "#/$defs/x"}}, schemas),
    st.builds(lambda c: {"guided_choice": c}, st.lists(st.text(max_size=8), max_size=30)),
    st.builds(lambda g: {"guided_grammar": g}, st.text(alphabet='start:rule |"()*+?/ab\n%json{}', max_size=120)),
    st.builds(lambda g: {"guided_grammar": "start: " + g}, st.text(alphabet='"ab()|*+? /[]-', max_size=60)),
    st.builds(lambda g: {"guided_regex": g}, st.text(alphabet="ab()[]|*+?{}0-9\\.^$", max_size=40)),
)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=bodies)
def test_fuzzed_grammar_requests_are_200s_or_400s_never_500s(server, body):
    r = httpx.post(server.url + CMPL, json={"prompt": "hi", "max_tokens": 2, **body}, timeout=60)
    assert r.status_code in (200, 400), (r.status_code, r.text, json.dumps(body)[:300])
    assert server.proc.poll() is None, server.output()


@pytest.mark.parametrize("depth", [33, 5000])  # past MAX_JSON_DEPTH; past Python's recursion limit
@pytest.mark.parametrize(
    "field, param",
    [("guided_json", "guided_json"), ("structured_outputs", "structured_outputs.json")],
)
def test_a_schema_sent_as_deep_json_text_is_a_400_naming_its_field(server, depth, field, param):
    """Issue 29 item 8: the body's depth check never saw inside a string; 5,000 levels
    were a RecursionError, and 33 passed."""
    text = '{"items": ' * depth + "{}" + "}" * depth
    body = {"guided_json": text} if field == "guided_json" else {"structured_outputs": {"json": text}}
    assert_error(httpx.post(server.url + CMPL, json={"prompt": "hi", "max_tokens": 2, **body}), 400, param)
    alive(server)


@pytest.mark.parametrize("depth", [33, 5000])
def test_deep_tool_call_arguments_in_the_history_are_a_400_naming_them(server, depth):
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[" * depth + "]" * depth}}
    msgs = [*MSGS, {"role": "assistant", "content": "", "tool_calls": [call]}]
    msgs.append({"role": "tool", "tool_call_id": "c1", "content": "ok"})
    r = httpx.post(server.url + CHAT, json={"messages": msgs, "max_tokens": 2})
    assert_error(r, 400, "messages[1].tool_calls[0].function.arguments")
    alive(server)


def test_a_schema_that_is_only_itself_is_a_400(server):
    body = {"messages": MSGS, "max_tokens": 4, "response_format": {"type": "json_schema", "json_schema": {}}}
    body["response_format"]["json_schema"]["schema"] = {"$ref": "#"}
    assert_error(httpx.post(server.url + CHAT, json=body, timeout=60), 400, "structured_outputs", "never be satisfied")
    alive(server)
