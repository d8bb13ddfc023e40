"""Request validation for the OpenAI endpoints, and the OpenAI error shape.

Bodies are checked field by field: a wrong type or an out-of-range value
becomes a 400 that names the parameter, never an exception deep in the engine.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
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
        """OpenAI's shape."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def anthropic_body(self) -> dict[str, Any]:
        """The same error in Anthropic's shape, for /v1/messages."""
        kind = _ANTHROPIC_BY_STATUS.get(self.status) or _ANTHROPIC_TYPES.get(self.type)
        kind = kind or ("invalid_request_error" if self.status < 500 else "api_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}


# Anthropic's error types, from ours (and from the status where our type has no match).
_ANTHROPIC_TYPES = {
    "invalid_request_error": "invalid_request_error",
    "authentication_error": "authentication_error",
    "permission_error": "permission_error",
    "not_found_error": "not_found_error",
    "rate_limit_error": "rate_limit_error",
    "service_unavailable": "overloaded_error",
    "internal_server_error": "api_error",
}
_ANTHROPIC_BY_STATUS = {404: "not_found_error", 413: "request_too_large"}


def is_anthropic_path(path: str) -> bool:
    """The routes that answer errors in Anthropic's shape (and take its x-api-key header)."""
    return "/v1/messages" in path


_MISSING = object()
# pydantic's lax bool: the strings and numbers it reads as booleans (vLLM's requests are pydantic).
_LAX_BOOLS: dict = {
    **dict.fromkeys(("1", "on", "t", "true", "y", "yes", 1), True),
    **dict.fromkeys(("0", "off", "f", "false", "n", "no", 0), False),
}
MAX_JSON_DEPTH = 32  # an OpenAI request nests about 6 deep (tools schemas a little more)


def _range(lo: float | None, hi: float | None) -> str:
    """'between 0 and 2', '≥ 1' or '≤ 100': a missing bound is not printed as None."""
    if hi is None:
        return f"≥ {lo}"
    if lo is None:
        return f"≤ {hi}"
    return f"between {lo} and {hi}"


def _out_of_range(name: str, v: float, lo: float | None, hi: float | None) -> APIError:
    """Our words, then the pydantic error type vLLM's 400 carries (clients match on it)."""
    kind = "greater_than_equal" if lo is not None and v < lo else "less_than_equal"
    return APIError(f"'{name}' must be {_range(lo, hi)}, got {v} ({kind})", param=name)


def check_json(data: Any, param: str | None = None) -> None:
    """Refuse what json.loads accepts but nothing downstream can use: nesting deeper than
    MAX_JSON_DEPTH, and strings with lone UTF-16 surrogates ("\\ud800"), which cannot be
    encoded to UTF-8 for the tokenizer. Iterative, so depth costs no recursion. `param`:
    the field that held `data` as JSON text (None: the body itself)."""
    stack = [(data, 1)]
    while stack:
        x, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            where = f"'{param}'" if param else "the request body"
            raise APIError(f"{where} nests deeper than {MAX_JSON_DEPTH} levels", param=param)
        if isinstance(x, str):
            _check_text(x)
        elif isinstance(x, dict):
            for k, v in x.items():
                _check_text(k)
                if isinstance(v, _LOOKED_AT):
                    stack.append((v, depth + 1))
        elif isinstance(x, list):
            stack.extend([(v, depth + 1) for v in x if isinstance(v, _LOOKED_AT)])


_LOOKED_AT = (str, list, dict)  # numbers, booleans and null need no look: a list of ids is checked 3x faster


def loads_field(text: str, param: str) -> Any:
    """A JSON value the body carries as a string (a schema, a call's arguments), held to
    the body's own limits: a 400 naming `param` when it nests deeper than MAX_JSON_DEPTH
    (deep enough to exhaust the parser's recursion, or anything's after it). Invalid
    JSON raises json.JSONDecodeError: what it means is the caller's to say."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise APIError(f"'{param}' nests deeper than {MAX_JSON_DEPTH} levels", param=param) from None
    check_json(value, param)
    return value


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
        """A boolean, coerced as pydantic's lax mode (and so vLLM) does: "true", "no", 1, 0.0..."""
        v = self._get(name, default)
        if v is default or isinstance(v, bool):
            return v
        key = v.strip().lower() if isinstance(v, str) else v
        if isinstance(key, (str, int, float)) and key in _LAX_BOOLS:
            return _LAX_BOOLS[key]
        raise APIError(f"'{self.path}{name}' must be a boolean, got {str(v)[:32]!r}", param=self.path + name)

    def int(self, name: str, default: int | None = None, lo: int | None = None, hi: int | None = None) -> int | None:
        v = self._get(name, default)
        if v is default:
            return v
        if isinstance(v, bool) or not isinstance(v, int):
            raise APIError(f"'{name}' must be an integer", param=name)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise _out_of_range(name, v, lo, hi)
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
            raise _out_of_range(name, v, lo, hi)
        return float(v)

    def str(self, name: str, default: str | None = None) -> str | None:
        v = self._get(name, default)
        if v is not default and not isinstance(v, str):
            raise APIError(f"'{name}' must be a string", param=name)
        return v

    def required_str(self, name: str) -> str:
        """A string that must be there; the error names its full path (messages[0].content[1].text)."""
        value = self.value(name)
        if not isinstance(value, str):
            raise APIError(f"'{self.path}{name}' must be a string", param=f"{self.path}{name}")
        return value

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
    logprob_token_ids: list[int] | None = None,
    defaults: dict[str, Any] | None = None,
) -> SamplingParams:
    """The sampling fields shared by both endpoints, including vLLM's extras. defaults:
    the model's (--generation-config), for the fields the body leaves out."""
    config, d = config or ServerConfig(), defaults or {}
    bias = logit_bias(body.dict("logit_bias"))
    n = body.int("n", 1, 1, 128)
    beam = body.bool("use_beam_search", False)
    kwargs = dict(
        n=n,
        temperature=body.float("temperature", d.get("temperature", 1.0), 0.0, 2.0),
        top_p=body.float("top_p", d.get("top_p", 1.0), 0.0, 1.0),
        top_k=body.int("top_k", d.get("top_k", 0), -1),
        min_p=body.float("min_p", d.get("min_p", 0.0), 0.0, 1.0),
        presence_penalty=body.float("presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=body.float("frequency_penalty", 0.0, -2.0, 2.0),
        repetition_penalty=body.float("repetition_penalty", d.get("repetition_penalty", 1.0), 0.0),
        seed=body.int("seed", None, -(2**63), 2**63 - 1),
        max_tokens=max_tokens,
        min_tokens=body.int("min_tokens", 0, 0),
        stop=body.stop(config.max_stop_strings, config.max_stop_string_chars),
        stop_token_ids=body.int_list("stop_token_ids"),
        include_stop_str_in_output=body.bool("include_stop_str_in_output", False),
        ignore_eos=body.bool("ignore_eos", False),
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        logprob_token_ids=logprob_token_ids,
        logit_bias=bias or None,
        allowed_token_ids=body.int_list("allowed_token_ids")
        if body.data.get("allowed_token_ids") is not None
        else None,
        skip_special_tokens=body.bool("skip_special_tokens", True),
        use_beam_search=beam,
        length_penalty=body.float("length_penalty", 1.0),
        early_stopping=body.bool("early_stopping", False),
        structured_outputs=structured_outputs,
    )
    if beam and "temperature" not in body.data:
        kwargs["temperature"] = 0.0
    return checked_sampling_params(**kwargs)


def checked_sampling_params(**kwargs: Any) -> SamplingParams:
    """SamplingParams, with its cross-field rules (min_tokens <= max_tokens, top_p > 0, ...) as 400s."""
    try:
        return SamplingParams(**kwargs)
    except ValueError as e:
        raise APIError(str(e), param=str(e).split(" ", 1)[0]) from None


def logprobs_count(body: Body, name: str, max_logprobs: int, vocab_size: int) -> int | None:
    """`top_logprobs`, `logprobs` (completions) or `prompt_logprobs`: a count ≥ 0, or -1 for
    the whole vocabulary as in vLLM; either way within --max-logprobs (vLLM errors too)."""
    v = body.int(name, None)
    if v is None:
        return None
    if v < -1:
        raise APIError(f"'{name}' must be ≥ 0, or -1 for the whole vocabulary; got {v}", param=name)
    count = vocab_size if v == -1 else v
    if count > max_logprobs:
        asked = f"-1 (the whole vocabulary, {vocab_size} tokens)" if v == -1 else str(v)
        raise APIError(f"'{name}' is {asked}, more than --max-logprobs {max_logprobs}", param=name)
    return count


def logprob_token_ids(body: Body, logprobs: bool, needs: str = "'logprobs': true") -> list[int] | None:
    """vLLM's `logprob_token_ids`: the tokens whose logprobs each step reports (with the
    sampled one), in place of the top N. It needs `logprobs` (`needs` says how the API sets it)."""
    given = body.data.get("logprob_token_ids") is not None
    ids = body.int_list("logprob_token_ids")
    if not given:
        return None
    if not ids:
        raise APIError("'logprob_token_ids' must not be an empty list", param="logprob_token_ids")
    if not logprobs:
        vllm = "must be set to true" if "true" in needs else "must be set"
        raise APIError(
            f"'logprob_token_ids' needs {needs} (vLLM: when using `logprob_token_ids`, `logprobs` {vllm}.)",
            param="logprob_token_ids",
        )
    return ids


@dataclass(frozen=True)
class OutputOptions:
    """What a response carries beyond OpenAI's fields: vLLM's request extras."""

    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with usage
    continuous_usage: bool = False  # stream_options.continuous_usage_stats: usage on every chunk
    return_token_ids: bool = False  # token_ids on choices, prompt_token_ids beside them
    tokens_as_ids: bool = False  # return_tokens_as_token_ids: logprobs name tokens "token_id:N"


def output_options(body: Body, config: ServerConfig) -> OutputOptions:
    stream, include_usage, continuous = stream_options(body)
    as_ids = body.bool("return_tokens_as_token_ids", None)
    forced = stream and config.enable_force_include_usage  # vLLM: usage on every chunk and at the end
    return OutputOptions(
        stream=stream,
        include_usage=include_usage or forced,
        continuous_usage=continuous or forced,
        return_token_ids=bool(body.bool("return_token_ids", False)),
        tokens_as_ids=config.return_tokens_as_token_ids if as_ids is None else as_ids,
    )


def check_prompt_logprobs(prompt_logprobs: int | None, stream: bool) -> None:
    if prompt_logprobs is not None and stream:
        raise APIError("'prompt_logprobs' are not available with 'stream': true", param="prompt_logprobs")


def prompt_logprobs_json(entries: list | None, token_text) -> list[dict[str, Any] | None] | None:
    """vLLM's prompt_logprobs: per prompt token None (the first) or {"id": {"logprob", "rank",
    "decoded_token"}}; -inf becomes -9999.0 as in vLLM, since JSON has no infinity."""
    if entries is None:
        return None
    return [
        None
        if e is None
        else {
            str(t): {"logprob": max(v.logprob, -9999.0), "rank": v.rank, "decoded_token": token_text(t)}
            for t, v in e.items()
        }
        for e in entries
    ]


def stream_options(body: Body) -> tuple[bool, bool, bool]:
    """(stream, usage at the end, usage on every chunk): `stream`, `stream_options.include_usage`
    and vLLM's `stream_options.continuous_usage_stats` (it needs include_usage, as in vLLM).
    Like vLLM, stream_options without `stream: true` is a 400."""
    stream = body.bool("stream", False)
    opts = body.obj("stream_options")
    if opts.data and not stream:
        raise APIError("'stream_options' can only be given with 'stream': true", param="stream_options")
    include_usage = opts.bool("include_usage", False)
    continuous = opts.bool("continuous_usage_stats", False)
    opts.reject_unread()
    return stream, include_usage, include_usage and continuous


def logit_bias(given: dict[str, Any]) -> dict[int, float]:
    """{"token id": bias}, each bias in [-100, 100]; an error names every key that broke it."""
    out, bad = {}, []
    for k, v in given.items():
        if not k.strip().lstrip("+-").isdigit():
            bad.append(f"key {k[:32]!r} is not a token id")
        elif isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            bad.append(f"[{k!r}] must be a number, got {str(v)[:32]!r}")
        elif not -100 <= v <= 100:
            bad.append(f"[{k!r}] must be between -100 and 100, got {v}")
        else:
            out[int(k)] = float(v)
    if bad:
        raise APIError(f"'logit_bias' has {len(bad)} bad key(s): " + "; ".join(bad), param="logit_bias")
    return out


def usage(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int | None, reasoning_tokens: int | None = None
) -> dict[str, Any]:
    """OpenAI's usage object; cached_tokens only under --enable-prompt-tokens-details, and
    reasoning_tokens where the engine tracked a think block (a reasoning parser, a budget)."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    if reasoning_tokens is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return out
