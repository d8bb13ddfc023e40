"""The Starlette app: routes, authentication, errors in OpenAI's shape, and `rawpage serve`.

POST /v1/chat/completions   POST /v1/completions   POST /v1/embeddings   GET /v1/models
POST /tokenize   POST /detokenize   GET /health   GET /version   GET /metrics
GET /v1/engine/events   GET / (the web page, unless --no-web)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rawpage import __version__
from rawpage.engine import LLMEngine
from rawpage.engine_args import EngineArgs
from rawpage.errors import WorkerDiedError
from rawpage.loader import resolve_model_path
from rawpage.loader.hub import looks_like_hub_id
from rawpage.outputs import RequestOutput
from rawpage.server.args import ServerConfig
from rawpage.server.async_engine import AsyncEngine, EngineDeadError, RequestFailedError
from rawpage.server.chat import create_chat_completion, parse_messages
from rawpage.server.completions import create_completion
from rawpage.server.embeddings import create_embedding, generate_only
from rawpage.server.engine_view import EngineView
from rawpage.server.lora_routes import adapter_models, load_lora_adapter, unload_lora_adapter
from rawpage.server.metrics import ServerMetrics
from rawpage.server.protocol import APIError
from rawpage.server.state import ServerState
from rawpage.server.streaming import ClientDisconnected
from rawpage.server.web import engine_events, index, page_info, static_file

logger = logging.getLogger("rawpage.server")

Handler = Callable[[Request, ServerState], Awaitable[Response]]


def default_served_name(model: str | None) -> str:
    """The hub id as given (vLLM's habit), else the folder or file name."""
    if model is not None and looks_like_hub_id(model):
        return model
    path = resolve_model_path(model)
    name = os.path.basename(os.path.normpath(path))
    return name.split(".")[0] if name.endswith(".gguf") else name


def build_app(engine_args: EngineArgs, config: ServerConfig | None = None) -> Starlette:
    config = config or ServerConfig()
    name = config.served_model_name or engine_args.served_model_name or default_served_name(engine_args.model)
    metrics = ServerMetrics(name)
    view = EngineView()

    def on_step(engine: LLMEngine, outputs: list[RequestOutput]) -> None:
        metrics.on_step(engine, outputs)
        view.on_step(engine, outputs)

    engine_args = engine_args.replace(served_model_name=name)  # the engine's log names it as the API does
    engine = AsyncEngine(
        engine_args,
        on_step=on_step,
        max_waiting_requests=config.max_waiting_requests,
        request_timeout=config.request_timeout,
        max_unread_tokens=config.max_unread_tokens,
        log_requests=not config.disable_log_requests,
    )
    state = ServerState(engine, name, metrics, config)
    middleware = []
    if config.allowed_origins:  # CORS is off unless the operator names origins
        cors = dict(allow_methods=config.allowed_methods, allow_headers=config.allowed_headers)
        middleware.append(Middleware(CORSMiddleware, allow_origins=config.allowed_origins, **cors))
    app = Starlette(routes=_routes(state, view), lifespan=_lifespan(state), middleware=middleware)
    # Starlette would redirect '/v1/models/' to a Location built from the Host header.
    app.router.redirect_slashes = False
    app.state.rawpage = state
    for status in (404, 405):
        app.add_exception_handler(status, _http_error)
    return app


def _routes(state: ServerState, view: EngineView) -> list[Route]:
    """The route table. Every route but /health (and the web page's static files) needs the API key."""
    config = state.config

    def api(handler: Handler, auth: bool = True) -> Callable[[Request], Awaitable[Response]]:
        return _endpoint(handler, state, auth)

    routes = [
        Route("/v1/chat/completions", api(generate_only(create_chat_completion)), methods=["POST"]),
        Route("/v1/completions", api(generate_only(create_completion)), methods=["POST"]),
        Route("/v1/embeddings", api(create_embedding), methods=["POST"]),  # --runner pooling
        Route("/v1/models", api(list_models), methods=["GET"]),
        Route("/v1/load_lora_adapter", api(load_lora_adapter), methods=["POST"]),
        Route("/v1/unload_lora_adapter", api(unload_lora_adapter), methods=["POST"]),
        Route("/tokenize", api(tokenize), methods=["POST"]),
        Route("/detokenize", api(detokenize), methods=["POST"]),
        Route("/health", api(health, auth=False), methods=["GET"]),
        Route("/version", api(version), methods=["GET"]),
        Route("/metrics", api(metrics_endpoint, auth=not config.metrics_public), methods=["GET"]),
        Route("/v1/engine/events", api(engine_events(view)), methods=["GET"]),
    ]
    if config.web:  # static files holding no data: no key needed (the page asks for one)
        routes += [
            Route("/", api(index, auth=False), methods=["GET"]),
            Route("/web/info", api(page_info, auth=False), methods=["GET"]),
            Route("/web/{name}", api(static_file, auth=False), methods=["GET"]),
        ]
    return routes


def _endpoint(handler: Handler, state: ServerState, auth: bool) -> Callable[[Request], Awaitable[Response]]:
    """Wrap a handler: the API key (if `auth`), and every failure as an OpenAI error object."""

    async def endpoint(request: Request) -> Response:
        try:
            if auth:
                state.check_auth(request)
            return await handler(request, state)
        except APIError as e:
            return JSONResponse(e.body(), status_code=e.status, headers=e.headers)
        except ClientDisconnected:
            return Response(status_code=499)
        except (EngineDeadError, RequestFailedError) as e:
            err = APIError(str(e), 500, type="internal_server_error")
            return JSONResponse(err.body(), status_code=500)
        except ValueError as e:  # a request the engine refused (e.g. at add time)
            return JSONResponse(APIError(str(e)).body(), status_code=400)
        except Exception as e:  # a bug: say so in the API's shape, log the traceback
            logger.exception("internal error in %s", request.url.path)
            err = APIError(f"internal error: {type(e).__name__}", 500, type="internal_server_error")
            return JSONResponse(err.body(), status_code=500)

    return endpoint


def _lifespan(state: ServerState) -> Callable:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        state.engine.start()  # loads the model in the engine thread; /health says 503 meanwhile
        watcher = asyncio.ensure_future(_watch_event_loop(state))
        yield
        watcher.cancel()
        logger.info("longest event-loop stall: %.3f s", state.metrics.loop_lag_max)
        state.engine.shutdown()
        state.close()

    return lifespan


async def _watch_event_loop(state: ServerState, period: float = 0.1) -> None:
    """Measure how late the event loop wakes from a short sleep: any work that blocks it
    (a template, a tokenizer call) delays every client and /health by as much. The worst
    lateness is a metric, rawpage:event_loop_lag_max_seconds."""
    loop = asyncio.get_running_loop()
    while True:
        t0 = loop.time()
        await asyncio.sleep(period)
        lag = loop.time() - t0 - period
        if state.metrics.observe_loop_lag(lag) and lag > 1.0:
            logger.warning("the event loop stalled for %.2f s", lag)


async def _http_error(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 404)
    err = APIError(
        f"{request.method} {request.url.path}: {getattr(exc, 'detail', 'not found')}",
        status,
        type="not_found_error" if status == 404 else "invalid_request_error",
    )
    return JSONResponse(err.body(), status_code=status)


async def health(request: Request, state: ServerState) -> Response:
    if state.engine.error is not None:  # the cause is in the server log, not for anonymous callers
        return JSONResponse({"status": "unhealthy"}, status_code=500)
    if state.engine.is_loading:
        return JSONResponse({"status": "loading"}, status_code=503)
    return JSONResponse({"status": "ok"})


async def version(request: Request, state: ServerState) -> Response:
    return JSONResponse({"version": __version__})


async def list_models(request: Request, state: ServerState) -> Response:
    llm = state.llm
    model = {
        "id": state.model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "rawpage",
        "root": state.model_name,
        "max_model_len": llm.max_model_len,
        "runner": llm.args.runner,  # rawpage's: "generate" (chat, completions) or "pooling" (embeddings)
    }
    adapters = adapter_models(state, state.created, llm.max_model_len)  # --enable-lora
    return JSONResponse({"object": "list", "data": [model, *adapters]})


async def tokenize(request: Request, state: ServerState) -> Response:
    """vLLM's shape: {"prompt": str} or {"messages": [...]} -> {"count", "max_model_len", "tokens"}."""
    body = await state.read_body(request)
    state.check_model(body)
    tok = state.llm.tokenizer
    if "messages" in body.data:
        ids = await state.render_chat(body, parse_messages(body))
    else:
        prompt = body.str("prompt")
        if prompt is None:
            raise APIError("give 'prompt' (a string) or 'messages'", param="prompt")
        (ids,) = await state.encode([prompt], add_special_tokens=body.bool("add_special_tokens", True))
    out = {"count": len(ids), "max_model_len": state.llm.max_model_len, "tokens": ids}
    if body.bool("return_token_strs", False):
        out["token_strs"] = [tok.id_to_token(i) for i in ids]
    return JSONResponse(out)


async def detokenize(request: Request, state: ServerState) -> Response:
    body = await state.read_body(request)
    state.check_model(body)
    ids = body.int_list("tokens")
    vocab = state.llm.model_config.vocab_size
    if any(not 0 <= t < vocab for t in ids):
        raise APIError(f"'tokens' must be ids in [0, {vocab})", param="tokens")
    text = await state.off_loop(lambda: state.llm.tokenizer.decode(ids, skip_special_tokens=False))
    return JSONResponse({"prompt": text})


async def metrics_endpoint(request: Request, state: ServerState) -> Response:
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def run_server(args: argparse.Namespace) -> int:
    """`rawpage serve`: uvicorn on --host:--port. Every argument error, and a port already in
    use, is reported before the model starts loading."""
    engine_args = EngineArgs.from_cli_args(args)
    config = ServerConfig.from_cli_args(args)
    check_port_free(config.host, config.port)
    app = build_app(engine_args, config)
    name = app.state.rawpage.model_name
    logger.info(
        "rawpage %s: serving %s at http://%s:%d/v1 (loading the model now; /health is 503 until ready)",
        __version__,
        name,
        config.host,
        config.port,
    )
    # uvicorn handles SIGINT/SIGTERM itself and afterwards re-raises the signal to the handler
    # found before it started. That handler is this no-op, so a graceful shutdown exits with 0.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    # uvicorn's deadline comes after ours, so that aborted streams can still say goodbye. log_config=None:
    # its loggers go through ours (cli.py), so that every line has a timestamp.
    uv = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level=config.log_level,
        timeout_graceful_shutdown=config.shutdown_timeout + 5,
        log_config=None,
    )
    server = _DrainingServer(uv, app.state.rawpage.engine, config.shutdown_timeout)
    server.run()
    return server.exit_code


def check_port_free(host: str, port: int) -> None:
    """Fail in a second, not after loading the model, if the port is taken."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is not "in use"
        try:
            s.bind(addr)
        except OSError as e:
            raise ValueError(
                f"cannot listen on {host}:{port}: {e.strerror}; stop whatever holds the port or pass --port"
            ) from None


class _DrainingServer(uvicorn.Server):
    """On SIGTERM or Ctrl-C uvicorn stops accepting connections and waits for the open ones.
    Streams still running after --shutdown-timeout are aborted in the engine, so that each
    ends with a final chunk (finish_reason "abort") and [DONE] rather than a cut connection."""

    def __init__(self, config: uvicorn.Config, engine: AsyncEngine, drain_timeout: float) -> None:
        super().__init__(config)
        self.engine, self.drain_timeout = engine, drain_timeout
        self._timer: threading.Timer | None = None
        self.exit_code = 0

    async def on_tick(self, counter: int) -> bool:
        """A lost tensor-parallel worker cannot be recovered in this process: stop serving
        (exit code 1), so that a supervisor restarts the whole server."""
        if isinstance(self.engine.error, WorkerDiedError):
            if not self.exit_code:
                logger.error("exiting: %s", self.engine.error)
                self.exit_code = 1
            return True
        return await super().on_tick(counter)

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self._timer is None:
            logger.info("shutting down: no new requests; streams have %g s to finish", self.drain_timeout)
            self._timer = threading.Timer(self.drain_timeout, self.engine.abort_all)
            self._timer.daemon = True
            self._timer.start()
        super().handle_exit(sig, frame)
