"""POST /infill (llama-server's, as llama.vim and llama.vscode send it), parsed once into
its InfillRequest (request.py). The sampling fields keep llama-server's names."""

from __future__ import annotations

from rawpage.server.protocol import APIError, Body, checked_sampling_params
from rawpage.server.request import InfillRequest, default_max_tokens, fim_params
from rawpage.server.state import ServerState

# llama-server fields that change nothing here: its prompt cache is our prefix cache
# (always on where --enable-prefix-caching is), rawpage's sampler chain has one fixed
# order, llama-server itself never applies t_max_prompt_ms, there is one engine (no
# slots), and the server serves its one model whatever 'model' says, as llama-server does.
NO_EFFECT_INFILL_FIELDS = frozenset({"cache_prompt", "samplers", "t_max_prompt_ms", "id_slot", "model"})
MAX_EXTRA_CHUNKS = 256


def parse_infill(body: Body, state: ServerState, rid: str) -> InfillRequest:
    """An /infill body -> its InfillRequest: every field read, the rest refused."""
    prefix, suffix = body.str("input_prefix", "") or "", body.str("input_suffix", "") or ""
    prompt = body.str("prompt", "") or ""
    extra = _extra(body)
    n_predict = body.int("n_predict", None, -1)
    if n_predict == 0:
        raise APIError("'n_predict' must be -1 (no limit) or at least 1", param="n_predict")
    seed = body.int("seed", None, -1, 2**64 - 1)
    d = state.info.sampling_defaults  # --generation-config, for the fields the body leaves out
    params = checked_sampling_params(
        temperature=body.float("temperature", d.get("temperature", 1.0), 0.0),
        top_k=max(body.int("top_k", d.get("top_k", 0)), 0),  # llama-server: <= 0 keeps every token
        top_p=body.float("top_p", d.get("top_p", 1.0), 0.0, 1.0),
        min_p=body.float("min_p", d.get("min_p", 0.0), 0.0, 1.0),
        repetition_penalty=body.float("repeat_penalty", d.get("repetition_penalty", 1.0), 0.0),
        presence_penalty=body.float("presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=body.float("frequency_penalty", 0.0, -2.0, 2.0),
        seed=None if seed in (None, -1, 2**32 - 1) else seed,  # llama-server's "random" seeds
        max_tokens=default_max_tokens(state, None) if n_predict in (None, -1) else n_predict,
        stop=body.stop(state.config.max_stop_strings, state.config.max_stop_string_chars),
        ignore_eos=body.bool("ignore_eos", False),
    )
    fields = body.value("response_fields") or []
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise APIError("'response_fields' must be a list of field names", param="response_fields")
    samplers = body.value("samplers")
    if samplers is not None and not (isinstance(samplers, list) and all(isinstance(s, str) for s in samplers)):
        raise APIError("'samplers' must be a list of sampler names", param="samplers")
    req = InfillRequest(
        rid,
        prefix,
        suffix,
        prompt,
        extra,
        fim_params(state, params, "input_prefix"),
        bool(body.bool("stream", False)),
        body.int("n_indent", 0, 0) or 0,
        body.int("t_max_predict_ms", 0, 0) or 0,
        tuple(fields),
        bool(body.bool("return_tokens", False)),
    )
    body.reject_unread(NO_EFFECT_INFILL_FIELDS)
    return req


def _extra(body: Body) -> tuple[tuple[str, str], ...]:
    """input_extra: [{"filename": str, "text": str}, ...], other files as context."""
    chunks = body.value("input_extra") or []
    if not isinstance(chunks, list) or len(chunks) > MAX_EXTRA_CHUNKS:
        raise APIError(f"'input_extra' must be a list of at most {MAX_EXTRA_CHUNKS} chunks", param="input_extra")
    out = []
    for c in chunks:
        ok = isinstance(c, dict) and set(c) <= {"filename", "text"}
        if not ok or not all(isinstance(c.get(k, ""), str) for k in ("filename", "text")):
            raise APIError('each input_extra chunk must be {"filename": string, "text": string}', param="input_extra")
        out.append((c.get("filename", "tmp"), c.get("text", "")))
    return tuple(out)
