"""Issue 42's details where clients compare us with vLLM: no stray U+FFFD at a reply's
end, vLLM's phrases in 400s that clients match, /v1/models' parent and permission, and
vllm:request_success_total's finished_reason label."""

import json

import httpx

MODEL = "SmolLM2-135M-Instruct"


def complete(server, stream=False, **body):
    body = {"model": MODEL, "prompt": "I love cats", "temperature": 0, "stream": stream, **body}
    return httpx.post(server.url + "/v1/completions", json=body, timeout=120)


def test_a_character_cut_by_a_special_token_leaves_no_fffd(plain_server):
    # ' \xf0\x9f' (15107, half an emoji) and then <|endoftext|> (0): the half is dropped, the space kept
    body = dict(logit_bias={"15107": 100, "0": 100}, max_tokens=3, ignore_eos=True, skip_special_tokens=False)
    body |= dict(logprobs=0, return_tokens_as_token_ids=True)
    whole = complete(plain_server, **body).json()["choices"][0]
    assert whole["logprobs"]["tokens"] == ["token_id:15107", "token_id:0", "token_id:0"]
    assert whole["text"] == " <|endoftext|><|endoftext|>"
    lines = complete(plain_server, stream=True, **body).text.splitlines()
    chunks = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == whole["text"]


def test_a_reply_cut_inside_a_character_ends_without_it(plain_server):
    body = dict(logit_bias={"15107": 100}, max_tokens=1, logprobs=0, return_tokens_as_token_ids=True)
    for stream in (False, True):
        r = complete(plain_server, stream=stream, **body)
        assert r.status_code == 200 and "\\ufffd" not in r.text and "\ufffd" not in r.text
