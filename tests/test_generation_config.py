"""--generation-config (issue 43 item 7): the model's generation_config.json fills the
sampling fields a request leaves out (auto, the default), `vllm` keeps the API's neutral
defaults, and a folder brings its own file; in the server's every API and in LLM."""

from __future__ import annotations

import json
import logging

import pytest

from rawpage import LLM, SamplingParams
from rawpage.engine_args import EngineArgs
from rawpage.errors import ModelLoadError
from rawpage.generation_config import sampling_defaults
from rawpage.server.chat_input import parse_chat_completion
from rawpage.server.messages_input import parse_messages_request
from rawpage.server.prompt_input import parse_completion
from rawpage.server.protocol import Body
from rawpage.server.responses_input import parse_responses
from rawpage.server.state import Caller
from tests.server.harness import in_process_app

MSGS = [{"role": "user", "content": "hi"}]
TINY_GEN = {"temperature": 0.7, "top_p": 0.9}  # tests/tiny_models.py writes this generation_config.json


def test_the_modes(tmp_path, caplog):
    gen = {**TINY_GEN, "top_k": 20, "max_new_tokens": 64, "do_sample": True, "eos_token_id": 2}
    with caplog.at_level(logging.INFO, "rawpage"):
        assert sampling_defaults("auto", str(tmp_path), gen) == {**TINY_GEN, "top_k": 20, "max_tokens": 64}
    assert "generation config auto: the model's generation_config.json" in caplog.text
    assert "temperature=0.7, top_k=20, top_p=0.9, max_tokens=64" in caplog.text
    assert sampling_defaults("vllm", str(tmp_path), gen) == {}
    caplog.clear()
    with caplog.at_level(logging.INFO, "rawpage"):
        assert sampling_defaults("auto", str(tmp_path / "m.gguf"), {}) == {}
    assert "auto: a GGUF file, which has no generation_config.json" in caplog.text
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.2, "repetition_penalty": 1.1}))
    assert sampling_defaults(str(tmp_path), "model", gen) == {"temperature": 0.2, "repetition_penalty": 1.1}
    assert sampling_defaults("vllm", "m", gen, {"max_new_tokens": 5, "min_p": 0.1}) == {"max_tokens": 5, "min_p": 0.1}
    with pytest.raises(ModelLoadError, match="give auto .*, vllm .* or a folder"):
        sampling_defaults("hf", "m", gen)
    with pytest.raises(ModelLoadError, match="unknown key.*'seed'"):
        sampling_defaults("vllm", "m", {}, {"seed": 1})
    with pytest.raises(ModelLoadError, match="generation config .*top_p.*--generation-config vllm"):
        sampling_defaults("auto", "m", {"top_p": 0.0})


def test_a_bad_mode_fails_before_the_model_loads():
    with pytest.raises(ValueError, match="generation_config must be auto, vllm or a folder"):
        EngineArgs(generation_config="hf")


def test_llm_takes_the_models_defaults_unless_told_vllm(tiny_model_dir):
    auto = LLM(tiny_model_dir, max_model_len=64)
    p = auto.get_default_sampling_params()
    assert (p.temperature, p.top_p) == (0.7, 0.9)
    assert LLM(tiny_model_dir, max_model_len=64, generation_config="vllm").get_default_sampling_params() == (
        SamplingParams()
    )
    # LLM.generate without params uses them: max_new_tokens from an override shows in the length
    short = LLM(tiny_model_dir, max_model_len=64, override_generation_config={"max_new_tokens": 3})
    out = short.generate(["hello"], use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) <= 3 and short.get_default_sampling_params().temperature == 0.7


@pytest.fixture(scope="module")
def state(tiny_model_dir):
    args = EngineArgs(model=tiny_model_dir, max_model_len=256, override_generation_config='{"max_new_tokens": 7}')
    with in_process_app(args) as (_, state):
        yield state


USER = Caller(None, admin=True)  # a server without keys: its one user


def _params(state, extra):
    return [
        parse_chat_completion(Body({"messages": MSGS, **extra}), state, "c", USER).chat.params,
        parse_completion(Body({"prompt": "a", **extra}), state, "p", USER).params,
        parse_responses(Body({"input": "hi", **extra}), state, USER).chat.params,
        parse_messages_request(Body({"messages": MSGS, "max_tokens": 7, **extra}), state, USER).chat.params,
    ]


def test_every_api_fills_what_a_request_leaves_out(state):
    for p in _params(state, {}):
        assert (p.temperature, p.top_p, p.max_tokens) == (0.7, 0.9, 7)
    for p in _params(state, {"temperature": 0.0, "top_p": 1.0}):
        assert (p.temperature, p.top_p) == (0.0, 1.0)  # a request's own fields win
