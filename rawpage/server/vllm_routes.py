"""Routes vLLM serves beside OpenAI's, and its per-request load reporting.

POST /invocations       SageMaker's one route: a body with "messages" is a chat
                        completion, one with "prompt" a completion (vLLM tries its
                        request types in that order)
GET  /load              {"server_load": requests in flight}, counted under
                        --enable-server-load-tracking (else 0), as vLLM does
GET  /tokenizer_info    the tokenizer's settings and chat template, only under
                        --enable-tokenizer-info-endpoint (it shows the template)
POST /reset_prefix_cache  forget the cached prompt prefixes, only under --server-dev-mode
                        (vLLM's VLLM_SERVER_DEV_MODE=1), behind the admin key
endpoint-load-metrics   the ORCA load report as a response header, when a request
                        asks for it with `endpoint-load-metrics-format: text|json`
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from rawpage.server.protocol import APIError
from rawpage.server.request import invocation_kind
from rawpage.server.state import ServerState

Handler = Callable[[Request, ServerState], Awaitable[Response]]


class ServerLoad:
    """vLLM's server_load_metrics: generating requests that have arrived and not yet
    finished sending their response (a stream counts until its last event)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled, self.count = enabled, 0

    def aware(self, handler: Handler) -> Handler:
        """The handler, counted while it runs; and its JSON reply with the ORCA header if asked."""

        async def counted(request: Request, state: ServerState) -> Response:
            done = self._arrived()
            try:
                response = await handler(request, state)
            except BaseException:
                done()
                raise
            if isinstance(response, StreamingResponse):  # counted until its last event is sent
                return _CountedStream(response, done)
            done()
            fmt = request.headers.get("endpoint-load-metrics-format")
            if fmt and response.status_code == 200:
                response.headers.update(state.metrics.orca_header(fmt))
            return response

        return counted

    def _arrived(self) -> Callable[[], None]:
        """Count one request; the function returned uncounts it, once however often it is called."""
        if not self.enabled:
            return lambda: None
        self.count += 1
        left = False

        def done() -> None:
            nonlocal left
            if not left:
                left = True
                self.count -= 1

        return done

    async def endpoint(self, request: Request, state: ServerState) -> Response:
        return JSONResponse({"server_load": self.count})


class _CountedStream(StreamingResponse):
    """A stream that uncounts itself when it ends, however it ends: its last event sent, or
    its client gone. A BackgroundTask would not do: Starlette skips it when a send to a
    closed connection raises (ASGI 2.4 servers do), and the count would never come down."""

    def __init__(self, stream: StreamingResponse, done: Callable[[], None]) -> None:
        super().__init__(stream.body_iterator, stream.status_code, background=stream.background)
        self.raw_headers, self.done = stream.raw_headers, done  # the handler's headers, media type included

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.done()


def invocations(chat: Handler, completion: Handler) -> Handler:
    """SageMaker's /invocations: the body's shape picks the handler, as in vLLM."""

    async def dispatch(request: Request, state: ServerState) -> Response:
        # The JSON is read once: read_body keeps it on the request for the handler's parse.
        kind = invocation_kind(await state.read_body(request))
        return await (chat if kind == "chat" else completion)(request, state)

    return dispatch


async def tokenizer_info(request: Request, state: ServerState) -> Response:
    """vLLM's /tokenizer_info: the tokenizer's class and settings, with its chat template."""
    info = state.info
    tok, template = info.tokenizer, info.template
    return JSONResponse(
        {
            "tokenizer_class": "PreTrainedTokenizerFast",  # tokenizer.json, as transformers names it
            "bos_token": tok.bos_token,
            "eos_token": tok.eos_token,
            "model_max_length": info.max_model_len,
            "vocab_size": tok.vocab_size,
            "chat_template": template.source if template is not None else None,
        }
    )


async def reset_prefix_cache(request: Request, state: ServerState) -> Response:
    """vLLM's POST /reset_prefix_cache[?reset_running_requests=true] (benchmark tools such as
    AIPerf call it between runs): 200 with an empty body, as vLLM answers. reset_external
    is accepted: this server has no external KV cache (connector) to reset."""
    flags = {}
    for name, value in request.query_params.items():
        if name not in ("reset_running_requests", "reset_external"):
            raise APIError(f"the query parameter '{name[:64]}' is not supported", param=name[:64])
        if value.lower() not in ("true", "false", "1", "0"):
            raise APIError(f"'{name}' must be true or false", param=name)
        flags[name] = value.lower() in ("true", "1")
    await state.engine.reset_prefix_cache(flags.get("reset_running_requests", False))
    return Response(status_code=200)
