"""Count tokens when the server's streamed `usage` does not say (llama-cpp-python, for one).

In order of preference:
  1. the server's own POST /tokenize, in vLLM's shape: {"model", "prompt"} or
     {"model", "messages"} -> {"tokens", "count"}; or in llama-server's: {"content"} -> {"tokens"};
  2. a local tokenizer: --tokenizer (a tokenizer.json, or a Hugging Face folder or .gguf
     that rawpage loads), else rawpage's default model, SmolLM2, which the peer servers
     also serve by default.
Prompt counts include the chat template where the counter knows it (vLLM's /tokenize,
rawpage's tokenizers), as a server's `usage.prompt_tokens` does; elsewhere they count
the plain-text transcript, a few tokens short. Generated text counted again can differ
by a token or two from what the model produced, so `usage` is always preferred.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rawpage.bench import http
from rawpage.bench.client import Server
from rawpage.bench.datasets import BenchRequest

SERVER = "server /tokenize"
LOCAL = "tokenizer"


class LocalTokenizer:
    """A tokenizer in this process: rawpage's (with chat template) or a bare tokenizer.json."""

    def __init__(self, path: str | None) -> None:
        self.template_tokenizer: Any = None  # rawpage.text.tokenizer.Tokenizer, when loaded by rawpage
        if path and path.endswith(".json"):
            from tokenizers import Tokenizer

            self.hf = Tokenizer.from_file(path)
            return
        try:
            from rawpage.loader import load_checkpoint
        except ImportError:
            raise SystemExit(
                "the server reports no token usage and has no /tokenize, and rawpage is not "
                "installed to count tokens locally: pass --tokenizer path/to/tokenizer.json"
            ) from None
        self.template_tokenizer = load_checkpoint(path).tokenizer
        self.hf = self.template_tokenizer.hf

    def count(self, text: str, add_special_tokens: bool = False) -> int:
        return len(self.hf.encode(text, add_special_tokens=add_special_tokens).ids)

    def count_chat(self, messages: list[dict[str, str]]) -> int | None:
        tok = self.template_tokenizer
        if tok is None or tok.chat_template is None:
            return None
        return self.count(tok.apply_chat_template(messages, add_generation_prompt=True))


class TokenCounter:
    def __init__(self, server: Server, model: str, tokenizer: str | None) -> None:
        self.server = server
        self.model = model
        self.tokenizer_path = tokenizer
        self.server_shape = ""  # "vllm" or "llama.cpp" once a probe succeeds
        self.local: LocalTokenizer | None = None
        self.source = ""  # SERVER or LOCAL once the first count has chosen

    async def count_output(self, text: str) -> int:
        """Tokens of generated text: no BOS or other special tokens."""
        await self._choose()
        if self.source == SERVER:
            if self.server_shape == "vllm":
                return await self._post({"model": self.model, "prompt": text, "add_special_tokens": False})
            return await self._post({"content": text, "add_special": False})
        assert self.local is not None
        return self.local.count(text)

    async def count_input(self, req: BenchRequest, chat: bool) -> int:
        """Tokens of a prompt as the server sees it, chat template and BOS included where known."""
        await self._choose()
        if self.source == SERVER:
            if self.server_shape == "vllm":
                if chat:
                    return await self._post(
                        {
                            "model": self.model,
                            "messages": req.messages,
                            "add_generation_prompt": True,
                        }
                    )
                return await self._post({"model": self.model, "prompt": req.prompt})
            return await self._post({"content": req.prompt, "add_special": True})
        assert self.local is not None
        if chat and (n := self.local.count_chat(req.messages)) is not None:
            return n
        return self.local.count(req.prompt, add_special_tokens=True)

    async def _choose(self) -> None:
        if self.source:
            return
        for shape, body in [
            ("vllm", {"model": self.model, "prompt": "hello world"}),
            ("llama.cpp", {"content": "hello world"}),
        ]:
            try:
                if await self._post(body) > 0:
                    self.server_shape, self.source = shape, SERVER
                    return
            except (http.HTTPError, OSError, EOFError, asyncio.TimeoutError, ValueError, KeyError, TypeError):
                pass  # no /tokenize, or not this shape
        self.local = LocalTokenizer(self.tokenizer_path)
        self.source = LOCAL

    async def _post(self, body: dict[str, Any]) -> int:
        data = await self.server.post_json("/tokenize", body)
        return int(data["count"]) if "count" in data else len(data["tokens"])
