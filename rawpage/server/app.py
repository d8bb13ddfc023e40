"""The Starlette app: routes, authentication, errors in OpenAI's shape, and `rawpage serve`.

POST /v1/chat/completions   POST /v1/completions   POST /v1/embeddings
POST /v1/responses   GET|DELETE /v1/responses/{id}   POST /v1/responses/{id}/cancel   (OpenAI's Responses)
POST /v1/messages   POST /v1/messages/count_tokens   (Anthropic's Messages)
GET /v1/models   GET /v1/models/{id}
POST /tokenize   POST /detokenize   GET /health   GET /version   GET /metrics
GET /v1/engine/events   GET / (the web page, unless --no-web)
vLLM's own: POST /v1/chat/completions/batch   POST /invocations   GET /load
GET /tokenizer_info (under --enable-tokenizer-info-endpoint), POST /reset_prefix_cache
(under --server-dev-mode); see vllm_routes.py
llama-server's: POST /infill (fill-in-the-middle for editors, infill.py)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import errno
import logging
import os
import re
import signal
import socket
import threading
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rawpage import __version__
from rawpage.engine import LLMEngine
from rawpage.engine_args import EngineArgs
from rawpage.errors import CONFIG_ERRORS, WorkerDiedError
from rawpage.loader import resolve_model_path
from rawpage.loader.hub import looks_like_hub_id
from rawpage.outputs import RequestOutput
from rawpage.server.args import ServerConfig
from rawpage.server.async_engine import AsyncEngine, EngineDeadError, RequestFailedError
from rawpage.server.chat import create_chat_completion
from rawpage.server.chat_batch import create_batch_chat_completion
from rawpage.server.completions import create_completion
from rawpage.server.embeddings import create_embedding, generate_only
from rawpage.server.engine_view import EngineView
from rawpage.server.header_timeout import uvicorn_limits
from rawpage.server.infill import create_infill
from rawpage.server.listener import listening_socket, quiet_accept_errors
from rawpage.server.lora_routes import adapter_models, describe_load_policy, load_lora_adapter, unload_lora_adapter
from rawpage.server.messages import count_message_tokens, create_message
from rawpage.server.metrics import ServerMetrics
from rawpage.server.prompt_input import parse_detokenize, parse_tokenize
from rawpage.server.protocol import APIError, is_anthropic_path
from rawpage.server.request_guard import RequestGuard
from rawpage.server.responses import cancel_response, create_response, delete_response, retrieve_response
from rawpage.server.root_path import RootPath, normalize_root_path, route_path
from rawpage.server.state import ServerState
from rawpage.server.streaming import ClientDisconnected
from rawpage.server.vllm_routes import ServerLoad, invocations, reset_prefix_cache, tokenizer_info
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


def served_names(engine_args: EngineArgs, config: ServerConfig) -> list[str]:
    """--served-model-name's names (vLLM takes several: the first is reported, all are accepted)."""
    names = config.served_model_name or engine_args.served_model_name or default_served_name(engine_args.model)
    return [names] if isinstance(names, str) else list(names)


def build_app(engine_args: EngineArgs, config: ServerConfig | None = None) -> Starlette:
    config = config or ServerConfig()
    name, *aliases = served_names(engine_args, config)
    config = dataclasses.replace(config, model_aliases=[*config.model_aliases, *aliases])
    metrics = ServerMetrics(name)
    view = EngineView()  # its owner_of is the AsyncEngine's, below

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
    view.owner_of = engine.owner_of  # which tenant each request is: the engine view shows each its own
    state = ServerState(engine, name, metrics, config)
    # --root-path first (root_path.py); then the guard: a request for another Host, or a foreign
    # page's POST, reaches nothing.
    middleware = [Middleware(RootPath, root_path=config.root_path), Middleware(RequestGuard, config=config)]
    if config.allowed_origins:  # CORS is off unless the operator names origins
        cors = dict(
            allow_methods=config.allowed_methods,
            allow_headers=config.allowed_headers,
            allow_credentials=config.allow_credentials,
        )
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

    def api(handler: Handler, auth: bool = True, admin: bool = False) -> Callable[[Request], Awaitable[Response]]:
        return _endpoint(handler, state, auth, admin)

    def anthropic(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        return _endpoint(load.aware(generate_only(handler)), state, auth=True, anthropic=True)

    load = ServerLoad(config.enable_server_load_tracking)
    lora_admin = config.admin_only_lora_updating
    chat_only, completion_only = generate_only(create_chat_completion), generate_only(create_completion)
    chat, completion = load.aware(chat_only), load.aware(completion_only)
    routes = [
        Route("/v1/chat/completions", api(chat), methods=["POST"]),
        Route(
            "/v1/chat/completions/batch", api(load.aware(generate_only(create_batch_chat_completion))), methods=["POST"]
        ),
        Route("/v1/completions", api(completion), methods=["POST"]),
        Route("/infill", api(load.aware(generate_only(create_infill))), methods=["POST"]),  # llama-server's FIM
        Route("/v1/responses", api(load.aware(generate_only(create_response))), methods=["POST"]),
        Route("/v1/responses/{response_id}", api(retrieve_response), methods=["GET"]),
        Route("/v1/responses/{response_id}", api(delete_response), methods=["DELETE"]),
        Route("/v1/responses/{response_id}/cancel", api(cancel_response), methods=["POST"]),
        Route("/v1/messages", anthropic(create_message), methods=["POST"]),
        Route("/v1/messages/count_tokens", anthropic(count_message_tokens), methods=["POST"]),
        Route("/v1/embeddings", api(load.aware(create_embedding)), methods=["POST"]),  # --runner pooling
        Route("/invocations", api(load.aware(invocations(chat_only, completion_only))), methods=["POST"]),
        Route("/load", api(load.endpoint), methods=["GET"]),
        Route("/v1/models", api(list_models), methods=["GET"]),
        Route("/v1/models/{model_id:path}", api(retrieve_model), methods=["GET"]),
        # --admin-only-lora-updating: the admin's call; otherwise each key changes its own adapters (lora_routes)
        Route("/v1/load_lora_adapter", api(load_lora_adapter, admin=lora_admin), methods=["POST"]),
        Route("/v1/unload_lora_adapter", api(unload_lora_adapter, admin=lora_admin), methods=["POST"]),
        Route("/tokenize", api(tokenize), methods=["POST"]),
        Route("/detokenize", api(detokenize), methods=["POST"]),
        Route("/health", api(health, auth=False), methods=["GET"]),
        Route("/version", api(version), methods=["GET"]),
        # /metrics counts every tenant's traffic (and prefix-cache hits): the admin's, if there is one.
        Route("/metrics", api(metrics_endpoint, auth=not config.metrics_public, admin=True), methods=["GET"]),
        Route("/v1/engine/events", api(engine_events(view)), methods=["GET"]),
    ]
    if config.enable_tokenizer_info_endpoint:
        routes.append(Route("/tokenizer_info", api(tokenizer_info), methods=["GET"]))
    if config.server_dev_mode:  # every tenant's cached prefixes: the admin's call, if there is one
        routes.append(Route("/reset_prefix_cache", api(reset_prefix_cache, admin=True), methods=["POST"]))
    if config.web:  # static files holding no data: no key needed (the page asks for one)
        routes += [
            Route("/", api(index, auth=False), methods=["GET"]),
            Route("/web/info", api(page_info, auth=False), methods=["GET"]),
            Route("/web/{name}", api(static_file, auth=False), methods=["GET"]),
        ]
    return routes


def _endpoint(
    handler: Handler, state: ServerState, auth: bool, admin: bool = False, anthropic: bool = False
) -> Callable[[Request], Awaitable[Response]]:
    """Wrap a handler: the API key (if `auth`; the admin key too if `admin` and there is
    one), and every failure as an error object in the API's shape: OpenAI's, or with
    `anthropic` Anthropic's (whose clients also send the key as x-api-key)."""

    def error(e: APIError) -> Response:
        return JSONResponse(e.anthropic_body() if anthropic else e.body(), status_code=e.status, headers=e.headers)

    async def endpoint(request: Request) -> Response:
        try:
            if auth:
                _check_access(state, request, admin, x_api_key=anthropic)
            state.queue_as(request)
            return await handler(request, state)
        except APIError as e:
            return error(e)
        except ClientDisconnected:
            return Response(status_code=499)
        except ClientDisconnect:  # the client left before its whole body arrived
            logger.info("%s: the client closed the connection before sending the whole body", request.url.path)
            return Response(status_code=499)
        except (EngineDeadError, RequestFailedError) as e:
            return error(APIError(str(e), 500, type="internal_server_error"))
        except ValueError as e:  # a request the engine refused (e.g. at add time)
            return error(APIError(str(e)))
        except Exception as e:  # a bug: say so in the API's shape, log the traceback
            logger.exception("internal error in %s", request.url.path)
            return error(APIError(f"internal error: {type(e).__name__}", 500, type="internal_server_error"))

    return endpoint


def _check_access(state: ServerState, request: Request, admin: bool, x_api_key: bool = False) -> None:
    """The API key; on an `admin` route the --admin-api-key, when the operator set one."""
    caller = state.check_auth(request, x_api_key)
    if admin and state.config.admin_api_key and not caller.admin:
        raise APIError(
            f"{request.url.path} needs the --admin-api-key", 403, type="permission_error", code="admin_key_required"
        )


def _lifespan(state: ServerState) -> Callable:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        state.engine.start()  # loads the model in the engine thread; /health says 503 meanwhile
        asyncio.get_running_loop().set_exception_handler(quiet_accept_errors)  # listener.py logs them
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
    """404 and 405 in OpenAI's shape; a 404 under /v1 (an OpenAI route this server lacks,
    such as /v1/embeddings) names the routes it does serve."""
    status = getattr(exc, "status_code", 404)
    message = f"{request.method} {request.url.path}: {getattr(exc, 'detail', 'not found')}"
    if status == 404 and route_path(request.scope).startswith("/v1/"):
        served = [_route_name(r) for r in request.app.routes if isinstance(r, Route) and r.path.startswith("/v1/")]
        message += "; this server serves " + ", ".join(served)
    err = APIError(message, status, type="not_found_error" if status == 404 else "invalid_request_error")
    return JSONResponse(err.anthropic_body() if is_anthropic_path(request.url.path) else err.body(), status_code=status)


def _route_name(route: Route) -> str:
    """'GET /v1/models/{model_id}': methods and path, without the path's converter names."""
    path = re.sub(r":\w+}", "}", route.path)
    return f"{'/'.join(sorted(route.methods - {'HEAD'}))} {path}"


async def health(request: Request, state: ServerState) -> Response:
    if state.engine.error is not None:  # the cause is in the server log, not for anonymous callers
        return JSONResponse({"status": "unhealthy"}, status_code=500)
    if state.engine.is_loading:
        return JSONResponse({"status": "loading"}, status_code=503)
    return JSONResponse({"status": "ok"})


async def version(request: Request, state: ServerState) -> Response:
    return JSONResponse({"version": __version__})


def _models(state: ServerState, request: Request) -> list[dict[str, Any]]:
    """The base model, then the LoRA adapters (--enable-lora) the caller may use, as model objects."""
    info = state.info
    model = {
        "id": state.model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "rawpage",
        "root": state.model_name,
        "max_model_len": info.max_model_len,
        "runner": info.runner,  # rawpage's: "generate" (chat, completions) or "pooling" (embeddings)
        "vision": info.images.accepted,  # rawpage's: chat takes image_url parts (the web page reads it)
        "parent": None,  # an adapter's is the base model
    }
    models = [model, *adapter_models(state, state.caller(request), state.created, info.max_model_len)]
    return [{**m, "permission": [_permission(state.created)]} for m in models]


def _permission(created: int) -> dict[str, Any]:
    """vLLM's ModelPermission, as every vLLM model card carries it (clients read it)."""
    return {
        "id": f"modelperm-{uuid.uuid4().hex}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }


async def list_models(request: Request, state: ServerState) -> Response:
    return JSONResponse({"object": "list", "data": _models(state, request)})


async def retrieve_model(request: Request, state: ServerState) -> Response:
    """GET /v1/models/{id}: one model object, or a 404 in OpenAI's shape naming those served."""
    model_id = request.path_params["model_id"]
    models = _models(state, request)
    for m in models:
        if m["id"] == model_id:
            return JSONResponse(m)
    raise APIError(
        f"the model '{model_id[:128]}' does not exist; this server serves {[m['id'] for m in models]}",
        404,
        param="model",
        type="not_found_error",
        code="model_not_found",
    )


async def tokenize(request: Request, state: ServerState) -> Response:
    """vLLM's shape: {"prompt": str} or {"messages": [...]} -> {"count", "max_model_len", "tokens"}."""
    req = await state.parse(request, parse_tokenize, state.caller(request))
    tok = state.info.tokenizer
    if req.messages is not None:
        ids, _ = await state.render_chat_images(req.render, req.messages)
    else:
        (ids,) = await state.encode([req.prompt], add_special_tokens=req.add_special_tokens)
    out = {"count": len(ids), "max_model_len": state.info.max_model_len, "tokens": ids, "token_strs": None}
    if req.return_token_strs:  # vLLM always sends the key: null unless asked
        out["token_strs"] = [tok.id_to_token(i) for i in ids]
    return JSONResponse(out)


async def detokenize(request: Request, state: ServerState) -> Response:
    ids = await state.parse(request, parse_detokenize, state.caller(request))
    text = await state.off_loop(lambda: state.info.tokenizer.decode(ids, skip_special_tokens=False))
    return JSONResponse({"prompt": text})


async def metrics_endpoint(request: Request, state: ServerState) -> Response:
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def run_server(args: argparse.Namespace) -> int:
    """`rawpage serve`: uvicorn on --host:--port. Every argument error, and a port already in
    use, is reported before the model starts loading."""
    engine_args = EngineArgs.from_cli_args(args)
    config = ServerConfig.from_cli_args(args)
    if config.uds is None:
        check_port_free(config.host, config.port)
    app = build_app(engine_args, config)
    name = app.state.rawpage.model_name
    scheme = "https" if config.ssl_certfile else "http"
    where = (
        f"unix:{config.uds}"
        if config.uds
        else f"{scheme}://{config.host}:{config.port}{normalize_root_path(config.root_path)}/v1"
    )
    logger.info(
        "rawpage %s: serving %s at %s (loading the model now; /health is 503 until ready)", __version__, name, where
    )
    policy = describe_load_policy(config)  # where runtime LoRA loads may read; a warning if anywhere
    if policy is not None:
        logger.log(logging.WARNING if config.runtime_lora_anywhere else logging.INFO, "%s", policy)
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
        uds=config.uds,
        log_level=config.uvicorn_log_level or config.log_level,
        timeout_graceful_shutdown=config.shutdown_timeout + 5,
        log_config=None,
        access_log=not config.disable_uvicorn_access_log,
        ssl_keyfile=config.ssl_keyfile,
        ssl_certfile=config.ssl_certfile,
        ssl_ca_certs=config.ssl_ca_certs,
        ssl_cert_reqs=config.ssl_cert_reqs,
        **uvicorn_limits(config),  # head deadline, keep-alive, head size (header_timeout.py)
        loop="asyncio",  # even where uvloop is installed: it accepts past BackoffSocket (listener.py)
    )
    logging.getLogger("uvicorn.error").addFilter(_hide_startup_complete)  # said once the model is loaded
    server = _DrainingServer(uv, app.state.rawpage.engine, config.shutdown_timeout)
    server.run(sockets=[listening_socket(uv)])  # one that backs off when out of file descriptors
    if config.uds and os.path.exists(config.uds):
        os.remove(config.uds)  # as uvicorn.run does
    return server.exit_code


STARTUP_COMPLETE = "Application startup complete."


def _hide_startup_complete(record: logging.LogRecord) -> bool:
    """uvicorn logs 'Application startup complete.' when the lifespan has started, while the
    model still loads in the engine thread, and before its error if the load fails. The
    server says it itself once the engine is ready (_DrainingServer.on_tick), as vLLM's
    does after loading: scripts wait for that line."""
    return record.getMessage() != STARTUP_COMPLETE


def check_port_free(host: str, port: int) -> None:
    """Fail in a second, not after loading the model, if --port or --host cannot be listened on."""
    if not 0 <= port <= 65535:
        raise ValueError(f"--port {port}: a port is a number from 0 to 65535 (0 picks a free one)")
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as e:
        raise ValueError(
            f"--host {host}: not an address or host name this machine can resolve ({e}); "
            "pass an address of this machine, 127.0.0.1, or 0.0.0.0 for every interface"
        ) from None
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is not "in use"
        try:
            s.bind(addr)
        except OSError as e:
            hint = "stop whatever holds the port or pass --port" if e.errno == errno.EADDRINUSE else "pass --host"
            raise ValueError(f"cannot listen on {host}:{port}: {e.strerror}; {hint}") from None


class _DrainingServer(uvicorn.Server):
    """On SIGTERM or Ctrl-C uvicorn stops accepting connections and waits for the open ones.
    Streams still running after --shutdown-timeout are aborted in the engine, so that each
    ends with a final chunk (finish_reason "abort") and [DONE] rather than a cut connection."""

    def __init__(self, config: uvicorn.Config, engine: AsyncEngine, drain_timeout: float) -> None:
        super().__init__(config)
        self.engine, self.drain_timeout = engine, drain_timeout
        self._timer: threading.Timer | None = None
        self._hurried = False  # a second signal came: streams were ended at once
        self._ready = False  # STARTUP_COMPLETE was logged: the engine is loaded
        self.exit_code = 0

    async def on_tick(self, counter: int) -> bool:
        """Log STARTUP_COMPLETE once the engine has loaded. An engine that could not start (its
        one line is logged), or a lost tensor-parallel worker, cannot be recovered in this
        process: stop serving, so that the user sees the failure at once and a supervisor
        restarts the whole server. Exit status 2 for a setting the user can change (as for a
        bad flag), 1 otherwise."""
        if not self._ready and self.engine.info is not None:
            self._ready = True
            logger.info(STARTUP_COMPLETE)
        error = self.engine.error
        if self.engine.failed_to_start:
            self.exit_code = self.exit_code or (2 if isinstance(error, CONFIG_ERRORS) else 1)
            return True
        if isinstance(error, WorkerDiedError):
            if not self.exit_code:
                logger.error("exiting: %s", error)
                self.exit_code = 1
            return True
        return await super().on_tick(counter)

    def handle_exit(self, sig: int, frame: Any) -> None:
        """The first signal starts the drain; a second (an impatient Ctrl-C) ends the open
        streams now, each still with its final chunk and [DONE]; only a third cuts them off."""
        if self._timer is None:
            logger.info("shutting down: no new requests; streams have %g s to finish", self.drain_timeout)
            self._timer = threading.Timer(self.drain_timeout, self.engine.abort_all)
            self._timer.daemon = True
            self._timer.start()
        elif not self._hurried:
            self._hurried = True
            logger.info("ending the open streams now (a third signal exits without waiting for them)")
            self._timer.cancel()
            self.engine.abort_all()
            return
        super().handle_exit(sig, frame)
