"""rawpage on Ray Serve: replicas of the OpenAI server, placed, scaled and routed by Ray.

    client ──HTTP──► Ray's proxy ──► OpenAIIngress (parses the body, hashes the prompt's start)
                                        │  DeploymentHandle, streaming
                                        ▼  PrefixAwareRouter picks the replica
                                     RawpageReplica × N (each: the whole `rawpage serve` app,
                                        its engine, its KV cache; N GPUs with --tensor-parallel-size N)

Each replica runs the same Starlette app as `rawpage serve` (rawpage/server/app.py),
so every route, error shape and stream is the one-server behaviour. The ingress
forwards each HTTP request as one message and streams back what the app sends.

Prefix-aware routing: requests whose prompts start alike should land on the replica
whose prefix cache already holds those blocks. The ingress names a prompt's start by
a hash of its first `ROUTING_PREFIX_CHARS` characters (about the first 16 KV blocks
of 16 tokens), and the router sends it to the replica that wins a rendezvous hash of
(prefix, replica): every router instance agrees with no shared state, and a replica
joining or leaving moves only its own share of prefixes. A prompt with no text, or a
home replica at its limit of ongoing requests, goes to the least-loaded replica.

Needs `pip install 'rawpage[ray]'`. `rawpage serve --ray --num-replicas 2` starts a
local Ray; docs/deploy.md shows a multi-node cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import signal
import threading
import time
from typing import Any

from ray import serve
from ray.serve.config import AutoscalingConfig, RequestRouterConfig
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from rawpage.engine_args import EngineArgs
from rawpage.server.args import ServerConfig

logger = logging.getLogger("rawpage.server")

ROUTING_PREFIX_CHARS = 1024  # about 256 tokens: the first 16 blocks of 16
# A body larger than this is parsed for its prefix key on a worker thread: json.loads of
# a long prompt or a request full of images takes milliseconds, and on the ingress's event
# loop it would hold every other request's bytes with it.
PARSE_ON_LOOP_BYTES = 64 << 10
REPLICA_HEADER = "x-rawpage-replica"  # which replica answered (for logs and tests)

# Ray starts its workers at nice 15 (its config worker_niceness, env RAY_worker_niceness)
# so that the raylet and every other process come first. Serving, the workers are the
# service: Ray's HTTP proxy, the ingress and the replicas are all workers, and at nice 15
# any busy process at nice 0 on the host leaves them about 3% of a core. 0 runs them at
# the priority `rawpage serve --ray` was started with, as `rawpage serve` runs.
SERVING_WORKER_NICENESS = "0"


def prompt_prefix_key(body: bytes) -> str | None:
    """A hash naming the start of the prompt of an OpenAI request body; None without one."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    if isinstance(data.get("messages"), list):
        text = "".join(f"{m.get('role')}\n{m.get('content')}\n" for m in data["messages"] if isinstance(m, dict))
    elif "prompt" in data:
        prompt = data["prompt"]  # a string, token ids or a list of prompts
        text = prompt if isinstance(prompt, str) else json.dumps(prompt)
    else:
        return None
    return hashlib.sha256(text[:ROUTING_PREFIX_CHARS].encode()).hexdigest() if text else None


class PrefixAwareRouter(RequestRouter):
    """Ray Serve's request-router extension point (ray.serve.request_router, Ray >= 2.46)."""

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        loads = self._replica_queue_len_cache  # ongoing requests per replica, as last probed
        by_load = sorted(candidate_replicas, key=lambda r: loads.get(r.replica_id) or 0)
        key = _key_of(pending_request)
        if key is None or not by_load:
            return [by_load]
        home = max(candidate_replicas, key=lambda r: _rendezvous(key, r.replica_id.unique_id))
        if (loads.get(home.replica_id) or 0) >= home.max_ongoing_requests:
            return [by_load]  # its home is full: the least loaded, rather than wait
        return [[home], [r for r in by_load if r is not home]]


def _key_of(pending: PendingRequest | None) -> str | None:
    if pending is None or not pending.args or not isinstance(pending.args[0], dict):
        return None
    return pending.args[0].get("prefix_key")


def _rendezvous(key: str, replica: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}|{replica}".encode(), digest_size=8).digest(), "big")


class RawpageReplica:
    """One `rawpage serve` app and its engine, inside a Ray actor."""

    def __init__(self, engine_args: EngineArgs, server_config: ServerConfig) -> None:
        from rawpage.server.app import build_app

        self.app = build_app(engine_args, server_config)
        self.engine = self.app.state.rawpage.engine
        self.engine.start()
        while self.engine.is_loading:  # Ray marks the replica ready when this returns
            time.sleep(0.1)
        if self.engine.error is not None:
            raise RuntimeError(f"the engine failed to start: {self.engine.error}")
        self.replica_id = serve.get_replica_context().replica_id.unique_id

    def check_health(self) -> None:
        """Ray calls this periodically; raising makes it replace the replica."""
        if self.engine.error is not None:
            raise RuntimeError(f"the engine stopped: {self.engine.error}")

    async def handle(self, request: dict[str, Any]):
        """Run one HTTP request through the app; yields the response start, then body chunks."""
        body_sent, gone = False, asyncio.Event()
        messages: asyncio.Queue = asyncio.Queue()

        async def receive() -> dict[str, Any]:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": request["body"], "more_body": False}
            await gone.wait()  # the app asks only to learn that the client left
            return {"type": "http.disconnect"}

        task = asyncio.ensure_future(self.app(_scope(request), receive, messages.put))
        try:
            while True:
                msg = await messages.get()
                if msg["type"] == "http.response.start":
                    headers = [*msg.get("headers", []), (REPLICA_HEADER.encode(), self.replica_id.encode())]
                    yield {"status": msg["status"], "headers": headers}
                elif msg["type"] == "http.response.body":
                    if msg.get("body"):
                        yield msg["body"]
                    if not msg.get("more_body"):
                        break
            await task
        finally:
            gone.set()  # the ingress went away (its client did): the app aborts the request
            if not task.done():
                task.cancel()


def _scope(request: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request["method"],
        "scheme": "http",
        "path": request["path"],
        "raw_path": request["path"].encode(),
        "root_path": "",
        "query_string": request["query"],
        "headers": request["headers"],
        "client": ("ray-ingress", 0),
        "server": ("rawpage-replica", 0),
        "state": {},
    }


class OpenAIIngress:
    """The HTTP entry: every path goes, as one message, to a replica chosen by the router."""

    def __init__(self, replicas: Any) -> None:
        self.replicas = replicas.options(stream=True)

    @staticmethod
    async def _prefix_key(body: bytes) -> str | None:
        if len(body) <= PARSE_ON_LOOP_BYTES:
            return prompt_prefix_key(body)
        return await asyncio.to_thread(prompt_prefix_key, body)

    async def __call__(self, request: Request) -> Response:
        body = await request.body()
        msg = {
            "method": request.method,
            "path": request.url.path,
            "query": request.url.query.encode(),
            # Ray's proxy gives every request an x-request-id; a replica would take it as the
            # OpenAI id, so it is dropped (ids keep their chatcmpl-/cmpl- form).
            "headers": [(k, v) for k, v in request.headers.raw if k.lower() != b"x-request-id"],
            "body": body,
            "prefix_key": await self._prefix_key(body) if request.method == "POST" else None,
        }
        stream = self.replicas.handle.remote(msg)
        start = await stream.__anext__()

        async def rest():
            async for chunk in stream:
                yield chunk

        response = StreamingResponse(rest(), status_code=start["status"])
        # Ray's proxy adds its own x-request-id to every response (the client's, if it sent
        # one): the replica's is dropped so that a response carries exactly one.
        response.raw_headers = [(k, v) for k, v in start["headers"] if k.lower() != b"x-request-id"]
        return response


def build_ray_app(
    engine_args: EngineArgs,
    server_config: ServerConfig | None = None,
    num_replicas: int = 1,
    max_replicas: int | None = None,
    replica_cpus: float = 1.0,
) -> Any:
    """The Serve application: the ingress and `num_replicas` replicas (with max_replicas,
    autoscaled between the two on ongoing requests). Each replica reserves one GPU per
    tensor-parallel rank on cuda."""
    from rawpage.backends import cuda_available

    on_gpu = engine_args.device == "cuda" or (engine_args.device == "auto" and cuda_available())
    options: dict[str, Any] = {
        "name": "rawpage-replica",
        "ray_actor_options": {"num_cpus": replica_cpus, "num_gpus": engine_args.tensor_parallel_size if on_gpu else 0},
        "max_ongoing_requests": 2 * engine_args.max_num_seqs,
        "request_router_config": RequestRouterConfig(request_router_class=PrefixAwareRouter),
        "health_check_period_s": 5,
    }
    if max_replicas is not None and max_replicas > num_replicas:
        options["autoscaling_config"] = AutoscalingConfig(
            min_replicas=num_replicas, max_replicas=max_replicas, target_ongoing_requests=engine_args.max_num_seqs
        )
    else:
        options["num_replicas"] = num_replicas
    replica = serve.deployment(RawpageReplica, **options)
    ingress = serve.deployment(OpenAIIngress, name="rawpage-ingress", ray_actor_options={"num_cpus": 0})
    return ingress.bind(replica.bind(engine_args, server_config or ServerConfig()))


def serve_at_our_priority() -> None:
    """Workers of a Ray that ray.init starts here run at SERVING_WORKER_NICENESS, unless
    RAY_worker_niceness says otherwise. A cluster joined through RAY_ADDRESS keeps the
    niceness its `ray start` was given (deploy/ray/cluster.yaml sets 0)."""
    os.environ.setdefault("RAY_worker_niceness", SERVING_WORKER_NICENESS)


def run_ray_server(args: argparse.Namespace) -> int:
    """`rawpage serve --ray`: start (or join, with RAY_ADDRESS) a Ray cluster, deploy, and
    serve until SIGINT or SIGTERM."""
    import ray

    engine_args = EngineArgs.from_cli_args(args)
    config = ServerConfig.from_cli_args(args)
    if args.num_replicas < 1:
        raise ValueError(f"--num-replicas {args.num_replicas}: must be >= 1")
    serve_at_our_priority()
    ray.init(ignore_reinit_error=True)
    serve.start(http_options={"host": config.host, "port": config.port})
    app = build_ray_app(engine_args, config, args.num_replicas, args.max_replicas)
    serve.run(app, name="rawpage", route_prefix="/")
    logger.info("rawpage on Ray Serve: %d replica(s) at http://%s:%d/v1", args.num_replicas, config.host, config.port)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # Ctrl-C, or a supervisor's stop
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    logger.info("shutting down the Serve application")
    serve.shutdown()
    ray.shutdown()
    return 0
