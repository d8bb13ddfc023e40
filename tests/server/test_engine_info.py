"""Issue 32: the server's handlers know the engine only through EngineInfo and AsyncEngine's
request API; the engine itself is read only in the engine thread (AsyncEngine, and the
observers that build the per-step engine view and metrics)."""

import ast
from pathlib import Path

import pytest

from rawpage import LLM, SamplingParams
from rawpage.errors import InvalidRequestError
from rawpage.server.engine_info import EngineInfo

SERVER = Path(__file__).resolve().parents[2] / "rawpage" / "server"
# The modules that run in the engine thread, or wire it up: they may hold the engine.
ENGINE_SIDE = {"async_engine", "engine_info", "engine_view", "metrics", "app"}
ENGINE_MODULES = {"rawpage.engine", "rawpage.pooling.pooling_engine"}


def imported(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return names | {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}


def test_handlers_import_no_engine():
    handlers = [p for p in SERVER.glob("*.py") if p.stem not in ENGINE_SIDE]
    assert len(handlers) > 20
    reaching = {p.stem: sorted(imported(p) & ENGINE_MODULES) for p in handlers if imported(p) & ENGINE_MODULES}
    assert not reaching, f"handler modules that import the engine: {reaching}"


def test_engine_info_states_the_engine_limits(tiny_model_dir):
    engine = LLM(tiny_model_dir, max_model_len=256, max_logprobs=5).engine
    info = EngineInfo(engine)
    assert (info.max_model_len, info.vocab_size, info.max_logprobs) == (256, engine.model_config.vocab_size, 5)
    assert (info.runner, info.scheduling_policy, info.lora, info.check_input) == ("generate", "fcfs", None, None)
    assert info.tokenizer is engine.tokenizer and info.chat_template is None
    assert info.template is engine.tokenizer.chat_template  # no --chat-template: the tokenizer's own
    checked = info.check_prompt([1, 2, 3], SamplingParams(max_tokens=10), 0, None)
    assert checked.prompt_token_ids == [1, 2, 3] and checked.grammar is None and checked.refusal is None
    refused = info.check_prompt(list(range(1, 250)), SamplingParams(max_tokens=10), 0, None).refusal
    assert isinstance(refused, InvalidRequestError) and "256" in str(refused) and refused.param == "prompt"


def test_handlers_see_adapters_read_only(tiny_model_dir):
    """--enable-lora: handlers get a read-only view of the known adapters and a reader of
    new ones, not the manager (only the engine thread registers or removes one)."""
    engine = LLM(tiny_model_dir, max_model_len=256, enable_lora=True, max_lora_rank=8).engine
    info = EngineInfo(engine)
    assert not isinstance(info.lora, type(engine.lora)) and info.lora.next_id() == 1
    with pytest.raises(TypeError):
        info.lora.adapters["sql"] = None  # a mappingproxy: the engine thread's dict, not writable here
    engine.lora.adapters["sql"] = "an adapter"  # as the engine thread's register() would
    assert info.lora.adapters["sql"] == "an adapter"  # a live view of the engine's own dict
