"""Fill-in-the-middle (issue 43 item 5): /v1/completions' suffix as continue.dev sends it,
llama-server's /infill as llama.vim and llama.vscode send it, on a tiny model whose
vocabulary has Qwen2.5-Coder's FIM tokens; the token names of the other code families
and a GGUF's FIM ids; and a 400 naming a model without FIM tokens."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import openai
import pytest

from rawpage.engine_args import EngineArgs
from rawpage.loader import load_checkpoint
from rawpage.server.infill import _Middle
from rawpage.text.fim import FimTokens, fim_prompt
from tests.server.harness import in_process_app
from tests.tiny_models import random_tensors, tiny_config, train_tokenizer, write_gguf, write_hf_folder

PRE, SUF, MID, PAD, REP, SEP = range(3, 9)  # the FIM tokens' ids in train_tokenizer(fim=True)
BOS = 1  # <|im_start|>, which tiny_models' tokenizer_config names as BOS (not added by the tokenizer)


@pytest.fixture(scope="module")
def fim_model(tmp_path_factory):
    """A tiny random Qwen2 whose vocabulary has <|fim_prefix|> and the other FIM tokens."""
    cfg = tiny_config("qwen2")
    folder = str(tmp_path_factory.mktemp("fim") / "hf")
    return write_hf_folder(folder, cfg, random_tensors(cfg, seed=3), train_tokenizer(fim=True))


@pytest.fixture(scope="module")
def client(fim_model):
    with in_process_app(EngineArgs(model=fim_model, max_model_len=256, generation_config="vllm")) as (c, _):
        yield c


def test_the_tokens_of_each_code_family_are_found():
    families = {
        "qwen2.5-coder": ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>"],
        "codellama": ["▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>"],
        "starcoder2": ["<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<fim_pad>", "<repo_name>", "<file_sep>"],
        "deepseek-coder": ["<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"],
    }
    for name, tokens in families.items():
        vocab = {t: 100 + i for i, t in enumerate(tokens)}
        fim = FimTokens.find(vocab.get)
        assert (fim.pre, fim.suf, fim.mid) == (100, 101, 102), name
    assert FimTokens.find({"▁<PRE>": 1, "▁<SUF>": 2, "▁<MID>": 3, "▁<EOT>": 4}.get).stop_token_ids == [4]
    assert FimTokens.find({"<|fim_prefix|>": 1}.get) is None  # no suffix or middle token: no FIM


def test_a_gguf_names_its_fim_tokens(tmp_path):
    cfg = tiny_config("qwen2")

    def ids(w):  # llama.cpp's keys; this GGUF calls the pad token its EOT as well
        for role, i in (("pre", PRE), ("suf", SUF), ("mid", MID), ("pad", PAD)):
            w.add_uint32(f"tokenizer.ggml.fim_{role}_token_id", i)
        w.add_uint32("tokenizer.ggml.eot_token_id", PAD)

    path = write_gguf(str(tmp_path / "f.gguf"), cfg, random_tensors(cfg), train_tokenizer(fim=True), extra_metadata=ids)
    fim = load_checkpoint(path).tokenizer.fim
    assert (fim.pre, fim.suf, fim.mid, fim.pad, fim.eot, fim.sep) == (PRE, SUF, MID, PAD, PAD, SEP)


def test_the_prompt_layout_and_its_trimming():
    fim = FimTokens(PRE, SUF, MID, PAD, REP, SEP)
    enc = lambda s: [ord(c) for c in s]  # noqa: E731 - one id per character
    ids, cut = fim_prompt(fim, enc, "ab", "cd", prompt="x", bos=BOS)
    assert (ids, cut) == ([BOS, PRE, *enc("abx"), SUF, *enc("cd"), MID], False)
    ids, _ = fim_prompt(fim, enc, "ab", "cd", extra=(("u.py", "z"),), repo_level=True)
    header = [REP, *enc("myproject\n"), SEP, *enc("u.py\n"), *enc("z"), SEP, *enc("filename\n")]
    assert ids == [*header, PRE, *enc("ab"), SUF, *enc("cd"), MID]
    ids, cut = fim_prompt(fim, enc, "0123456789" * 4, "abcdefghij", budget=23)
    # 20 tokens of room: 3/4 to the prefix's end, the rest to the suffix's start
    assert (cut, ids) == (True, [PRE, *enc("567890123456789"), SUF, *enc("abcde"), MID])


def test_continue_dev_suffix_on_completions(client, fim_model):
    """continue.dev's OpenAI provider: /v1/completions with prompt (before the cursor),
    suffix (after it), stop strings and stream: true."""
    oai = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=client)
    stream = oai.completions.create(
        model="hf",
        prompt="def add(a, b):\n    return",
        suffix="\n\nprint(add(1, 2))\n",
        max_tokens=8,
        temperature=0.0,
        stop=["\n\n", "```"],
        stream=True,
    )
    text = "".join(c.choices[0].text for c in stream)
    body = {"prompt": "def add(a, b):\n    return", "suffix": "\n\nprint(add(1, 2))\n", "max_tokens": 8}
    r = client.post(
        "/v1/completions", json={**body, "temperature": 0.0, "stop": ["\n\n", "```"], "return_token_ids": True}
    )
    choice = r.json()["choices"][0]
    assert r.status_code == 200 and choice["text"] == text
    tok = client.app.state.rawpage.info.tokenizer
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    want = [PRE, *enc(body["prompt"]), SUF, *enc(body["suffix"]), MID]
    assert choice["prompt_token_ids"] == want  # the FIM prompt, no repository header
    assert r.json()["usage"]["prompt_tokens"] == len(want)
    # truncate_prompt_tokens trims around the gap and keeps the FIM tokens
    r = client.post("/v1/completions", json={**body, "truncate_prompt_tokens": 8, "return_token_ids": True})
    ids = r.json()["choices"][0]["prompt_token_ids"]
    assert len(ids) == 8 and ids[0] == PRE and SUF in ids and ids[-1] == MID
    assert ids[1 : ids.index(SUF)] == enc(body["prompt"])[-len(ids[1 : ids.index(SUF)]) :]  # the prefix's end
    for bad in ({"prompt": [5, 6]}, {"echo": True}):
        r = client.post("/v1/completions", json={**body, **bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"


LLAMA_VIM = {  # the body llama.vim's llama#fim sends (its defaults)
    "id_slot": 0,
    "input_prefix": "import os\n\ndef main():\n",
    "input_suffix": "\n\nif __name__ == '__main__':\n    main()\n",
    "input_extra": [{"filename": "util.py", "text": "def helper():\n    return 1\n"}],
    "prompt": "    ",
    "n_predict": 16,
    "stop": [],
    "n_indent": 4,
    "top_k": 40,
    "top_p": 0.99,
    "samplers": ["top_k", "top_p", "infill"],
    "stream": False,
    "cache_prompt": True,
    "t_max_prompt_ms": 500,
    "t_max_predict_ms": 1000,
    "response_fields": ["content", "timings/prompt_n", "timings/predicted_n", "truncated", "tokens_cached"],
}


def test_llama_vim_infill(client):
    r = client.post("/infill", json=LLAMA_VIM)
    assert r.status_code == 200, r.text
    got = r.json()
    assert set(got) == {"content", "timings/prompt_n", "timings/predicted_n", "truncated", "tokens_cached"}
    assert got["truncated"] is False and got["timings/predicted_n"] >= 1
    full = client.post("/infill", json={**LLAMA_VIM, "response_fields": [], "temperature": 0.0, "n_indent": 0}).json()
    assert full["stop"] is True and full["stop_type"] in ("eos", "limit") and full["model"]
    assert full["tokens_predicted"] == full["timings"]["predicted_n"] and full["tokens_evaluated"] > 20
    assert full["prompt"].startswith("<|repo_name|>myproject\n<|file_sep|>util.py\ndef helper")
    assert full["prompt"].endswith("<|fim_middle|>") and "<|fim_prefix|>import os" in full["prompt"]


def test_llama_vscode_infill_streams_in_llama_servers_shape(client):
    body = {**LLAMA_VIM, "stream": True, "temperature": 0.0, "n_indent": 0, "response_fields": []}
    with client.stream("POST", "/infill", json=body) as r:
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    events = [json.loads(ln[6:]) for ln in lines]  # llama-server's plain stream: no [DONE]
    *pieces, last = events
    assert all(e["stop"] is False and {"content", "tokens_predicted"} <= set(e) for e in pieces)
    assert last["stop"] is True and last["content"] == "" and "timings" in last
    whole = client.post("/infill", json={**body, "stream": False}).json()
    assert "".join(e["content"] for e in pieces) == whole["content"]


def test_infill_bad_input_is_a_400(client):
    for bad, param in (
        ({"input_extra": [{"file": "x"}]}, "input_extra"),
        ({"n_predict": 0}, "n_predict"),
        ({"grammar": "root ::= x"}, "grammar"),
    ):
        r = client.post("/infill", json={**LLAMA_VIM, **bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_model_without_fim_tokens_says_so(tiny_model_dir):
    with in_process_app(EngineArgs(model=tiny_model_dir, max_model_len=256)) as (c, _):
        r = c.post("/v1/completions", json={"prompt": "a", "suffix": "b", "max_tokens": 2})
        assert r.status_code == 400 and "has no fill-in-the-middle tokens" in r.json()["error"]["message"]
        assert "'hf'" in r.json()["error"]["message"]  # the model, by its served name
        assert c.post("/infill", json={"input_prefix": "a"}).status_code == 400
        assert c.post("/v1/completions", json={"prompt": "a", "suffix": "", "max_tokens": 2}).status_code == 200


def test_n_indent_cuts_a_later_line_indented_less():
    req = SimpleNamespace(n_indent=4, t_max_predict_ms=0)
    m = _Middle(SimpleNamespace(), req, 0, False)
    sent = [m._add(d) for d in ("x = 1\n    y", " = 2\n", "  ", "  z\n", "w = 3")]
    assert sent[:4] == [("x = 1\n    y", False), (" = 2\n", False), ("  ", False), ("  z\n", False)]
    assert sent[4] == ("", True) and m.text == "x = 1\n    y = 2\n    z\n"


def test_t_max_predict_ms_stops_at_a_line_end_once_late():
    m = _Middle(SimpleNamespace(), SimpleNamespace(n_indent=0, t_max_predict_ms=50), 0, False)
    m.start -= 1.0  # a second into generating
    assert m._add("no line end yet") == ("no line end yet", False)
    assert m._add(" done\n") == (" done\n", True)
    m._finish("stop", "\n\n")
    assert (m.stop_type, m.stopping_word) == ("word", "\n\n")


def test_fim_tokenizes_no_more_of_each_side_than_could_be_kept(client):
    """Issue 44: a 3 MB prefix was tokenized whole (seconds of CPU) only for its end to be
    kept; now each side is cut to --max-model-len times the longest token first. Without
    truncation (a completion's suffix) a text that cannot fit is a 400 before tokenizing."""
    t0 = time.monotonic()
    r = client.post("/infill", json={**LLAMA_VIM, "input_prefix": "1" * 3_000_000, "response_fields": ["truncated"]})
    assert r.status_code == 200 and r.json()["truncated"] is True, r.text[:300]
    assert time.monotonic() - t0 < 5
    r = client.post("/v1/completions", json={"prompt": "1" * 3_000_000, "suffix": "x", "max_tokens": 2})
    assert r.status_code == 400 and "maximum context length is 256 tokens" in r.json()["error"]["message"]
