"""Request validation for the OpenAI endpoints, and the OpenAI error shape.

Bodies are checked field by field: a wrong type or an out-of-range value
becomes a 400 that names the parameter, never an exception deep in the engine.
"""

from __future__ import annotations

import math
from typing import Any

from rawpage.sampling_params import SamplingParams
from rawpage.server.args import ServerConfig
from rawpage.structured_output import StructuredOutputsParams


class APIError(Exception):
    """An error the client caused (or the server state it met), in OpenAI's shape."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        param: str | None = None,
        type: str = "invalid_request_error",
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.headers = headers
        self.message, self.status, self.param, self.type, self.code = (
            message,
            status,
            param,
            type,
            code,
        )

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


_MISSING = object()
MAX_JSON_DEPTH = 32  # an OpenAI request nests about 6 deep (tools schemas a little more)


def _range(lo: float | None, hi: float | None) -> str:
    """'between 0 and 2', '≥ 1' or '≤ 100': a missing bound is not printed as None."""
    if hi is None:
        return f"≥ {lo}"
    if lo is None:
        return f"≤ {hi}"
    return f"between {lo} and {hi}"


def check_json(data: Any) -> None:
    """Refuse what json.loads accepts but nothing downstream can use: nesting deeper than
    MAX_JSON_DEPTH, and strings with lone UTF-16 surrogates ("\\ud800"), which cannot be
    encoded to UTF-8 for the tokenizer. Iterative, so depth costs no recursion."""
    stack = [(data, 1)]
    while stack:
        x, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise APIError(f"the request body nests deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(x, str):
            _check_text(x)
        elif isinstance(x, dict):
            for k, v in x.items():
                _check_text(k)
                stack.append((v, depth + 1))
        elif isinstance(x, list):
            stack.extend((v, depth + 1) for v in x)


def _check_text(s: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise APIError("the request contains a string with a lone UTF-16 surrogate (invalid Unicode)") from None


class Body:
    """Typed access to a JSON object; every getter raises APIError(400, param=name).

    It remembers which fields a handler read, so that `reject_unread` can refuse the
    rest: a field we do not implement is a 400 that names it, never silently ignored."""

    def __init__(self, data: Any, path: str = "") -> None:
        if not isinstance(data, dict):
            raise APIError(f"'{path.rstrip('.') or 'the request body'}' must be a JSON object", param=path or None)
        self.data = data
        self.path = path  # "stream_options." for a nested object: names in errors are full paths
        self.read: set[str] = set()

    def mark_read(self, *names: str) -> None:
        """Fields a handler uses without a typed getter (messages, prompt, ...)."""
        self.read.update(names)

    def reject_unread(self, no_effect: frozenset[str] = frozenset()) -> None:
        """400 for the first field nobody read, unless it is one of the documented `no_effect` ones."""
        for name in self.data:
            if name not in self.read and name not in no_effect:
                raise APIError(f"'{self.path}{name}' is not supported by this server", param=self.path + name)

    def _get(self, name: str, default: Any) -> Any:
        self.read.add(name)
        v = self.data.get(name, _MISSING)
        return default if v is _MISSING or v is None else v

    def bool(self, name: str, default: bool | None = False) -> bool | None:
        v = self._get(name, default)
        if v is not default and not isinstance(v, bool):
            raise APIError(f"'{name}' must be a boolean", param=name)
        return v

    def int(self, name: str, default: int | None = None, lo: int | None = None, hi: int | None = None) -> int | None:
        v = self._get(name, default)
        if v is default:
            return v
        if isinstance(v, bool) or not isinstance(v, int):
            raise APIError(f"'{name}' must be an integer", param=name)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise APIError(f"'{name}' must be {_range(lo, hi)}, got {v}", param=name)
        return v

    def float(
        self, name: str, default: float | None = None, lo: float | None = None, hi: float | None = None
    ) -> float | None:
        v = self._get(name, default)
        if v is default:
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise APIError(f"'{name}' must be a number", param=name)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise APIError(f"'{name}' must be {_range(lo, hi)}, got {v}", param=name)
        return float(v)

    def str(self, name: str, default: str | None = None) -> str | None:
        v = self._get(name, default)
        if v is not default and not isinstance(v, str):
            raise APIError(f"'{name}' must be a string", param=name)
        return v

    def int_list(self, name: str) -> list[int]:
        v = self._get(name, [])
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise APIError(f"'{name}' must be a list of integers", param=name)
        return v

    def value(self, name: str) -> Any:
        """Any JSON value, or None; the caller checks its shape."""
        return self._get(name, None)

    def obj(self, name: str) -> Body:
        """A nested object as a Body of its own (absent: an empty one)."""
        return Body(self.dict(name), f"{self.path}{name}.")

    def dict(self, name: str) -> dict:
        v = self._get(name, {})
        if not isinstance(v, dict):
            raise APIError(f"'{name}' must be an object", param=name)
        return v

    def stop(self, max_count: int, max_chars: int) -> list[str]:
        v = self._get("stop", [])
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(s, str) and s for s in v):
            raise APIError("'stop' must be a non-empty string or a list of them", param="stop")
        if len(v) > max_count:
            raise APIError(f"'stop' has {len(v)} strings; the limit is {max_count} (--max-stop-strings)", param="stop")
        if any(len(s) > max_chars for s in v):
            raise APIError(
                f"a stop string is longer than {max_chars} characters (--max-stop-string-chars)", param="stop"
            )
        return v


def sampling_params(
    body: Body,
    max_tokens: int | None,
    logprobs: int | None,
    prompt_logprobs: int | None = None,
    config: ServerConfig | None = None,
    structured_outputs: StructuredOutputsParams | None = None,
) -> SamplingParams:
    """The sampling fields shared by both endpoints, including vLLM's extras."""
    config = config or ServerConfig()
    bias = body.dict("logit_bias")
    try:
        bias = {int(k): float(v) for k, v in bias.items()}
    except (TypeError, ValueError):
        raise APIError("'logit_bias' must map token ids to numbers", param="logit_bias") from None
    if any(not -100 <= v <= 100 for v in bias.values()):
        raise APIError("'logit_bias' values must be between -100 and 100", param="logit_bias")
    n = body.int("n", 1, 1, 128)
    beam = body.bool("use_beam_search", False)
    kwargs = dict(
        n=n,
        temperature=body.float("temperature", 1.0, 0.0, 2.0),
        top_p=body.float("top_p", 1.0, 0.0, 1.0),
        top_k=body.int("top_k", 0, -1),
        min_p=body.float("min_p", 0.0, 0.0, 1.0),
        presence_penalty=body.float("presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=body.float("frequency_penalty", 0.0, -2.0, 2.0),
        repetition_penalty=body.float("repetition_penalty", 1.0, 0.0),
        seed=body.int("seed", None, -(2**63), 2**63 - 1),
        max_tokens=max_tokens,
        min_tokens=body.int("min_tokens", 0, 0),
        stop=body.stop(config.max_stop_strings, config.max_stop_string_chars),
        stop_token_ids=body.int_list("stop_token_ids"),
        include_stop_str_in_output=body.bool("include_stop_str_in_output", False),
        ignore_eos=body.bool("ignore_eos", False),
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        logit_bias=bias or None,
        skip_special_tokens=body.bool("skip_special_tokens", True),
        use_beam_search=beam,
        length_penalty=body.float("length_penalty", 1.0),
        early_stopping=body.bool("early_stopping", False),
        structured_outputs=structured_outputs,
    )
    if beam and "temperature" not in body.data:
        kwargs["temperature"] = 0.0
    try:
        return SamplingParams(**kwargs)
    except ValueError as e:  # cross-field rules (min_tokens <= max_tokens, top_p > 0, ...)
        raise APIError(str(e), param=str(e).split(" ", 1)[0]) from None


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None) -> dict[str, Any]:
    """OpenAI's usage object; cached_tokens only under --enable-prompt-tokens-details."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out
