"""The `rawpage` command (also `python -m rawpage`): serve, generate, chat, bench.

rawpage serve [--model M] [engine flags]      OpenAI-compatible server
rawpage generate "prompt" [--max-tokens N]     print a completion as it is produced
rawpage chat                                   interactive chat with history
rawpage bench serve [--base-url URL] ...       load-test a server (vLLM's `vllm bench serve`)
rawpage bench throughput [engine flags] ...    offline throughput (vLLM's `vllm bench throughput`)
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
import uuid

from rawpage import __version__
from rawpage.backends.cpu_malloc import one_arena
from rawpage.engine_args import EngineArgs
from rawpage.errors import CONFIG_ERRORS
from rawpage.flags import add_flag, dashed, log_inert_flags

# Engine flags only `rawpage serve` can use: generate and chat run one request at a time,
# name no model in an API, and load no adapters.
SERVE_ONLY = (
    "served_model_name",
    "enable_lora",
    "max_loras",
    "max_lora_rank",
    "lora_modules",
    "scheduling_policy",
    "disable_log_stats",
)


def main(argv: list[str] | None = None) -> int:
    one_arena()  # first, before any thread allocates (cpu_malloc.py)
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "bench":
            return args.bench_main(args)
        if args.command == "serve":
            from rawpage.server.vllm_flags import check_vllm_flags

            check_vllm_flags(args)  # a refused flag stops here, before the model loads
        if args.command == "serve" and args.ray:
            return _serve_on_ray(args)
        if args.command == "serve":
            _log_inert_ray_flags(args)
            from rawpage.server.app import run_server

            return run_server(args)
        if args.command == "generate":
            return _generate(args)
        return _chat(args)
    except CONFIG_ERRORS as e:
        print(f"rawpage: error: {e}", file=sys.stderr)
        return 2


def _log_inert_ray_flags(args: argparse.Namespace) -> None:
    why = "without --ray, one server runs in this process"
    flags = ("num_replicas", "max_replicas")
    log_inert_flags({k for k in flags if getattr(args, k) is not None}, dict.fromkeys(flags, why))


def _serve_on_ray(args: argparse.Namespace) -> int:
    args.num_replicas = 1 if args.num_replicas is None else args.num_replicas
    try:
        from rawpage.server.serve_ray import run_ray_server
    except ImportError as e:
        raise ValueError(f"--ray needs Ray Serve ({e}); pip install 'rawpage[ray]'") from None
    return run_ray_server(args)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with every error (a bad value, an unknown flag) reported by the
    subcommand's own parser, so that it shows that subcommand's usage."""
    parser = argparse.ArgumentParser(
        prog="rawpage", description="LLM inference with PagedAttention and continuous batching"
    )
    parser.add_argument("--version", action="version", version=f"rawpage {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = _serve_parser(sub)

    gen = sub.add_parser("generate", help="complete one prompt and print the text as it is produced")
    gen.add_argument("prompt", help="the prompt text")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    _add_sampling_args(gen)
    EngineArgs.add_cli_args(gen, skip=SERVE_ONLY)

    chat = sub.add_parser("chat", help="interactive terminal chat (Ctrl-C stops a reply, Ctrl-D quits)")
    chat.add_argument("--system", help="system prompt")
    _add_sampling_args(chat)
    EngineArgs.add_cli_args(chat, skip=SERVE_ONLY)

    bench = _bench_parsers(sub)
    return _parse(parser, {"serve": serve, "generate": gen, "chat": chat, **bench}, argv)


def _bench_parsers(sub: argparse._SubParsersAction) -> dict[str, argparse.ArgumentParser]:
    """`rawpage bench serve` and `rawpage bench throughput`, keyed as _parse looks them up."""
    from rawpage.bench import serve, throughput

    bench = sub.add_parser("bench", help="benchmark a server or the engine, as `vllm bench` does")
    kinds = bench.add_subparsers(dest="bench_command", required=True)
    parsers = {}
    for name, module, text in [
        ("serve", serve, "load-test an OpenAI-compatible server (vLLM's `vllm bench serve`)"),
        ("throughput", throughput, "offline throughput of the engine (vLLM's `vllm bench throughput`)"),
    ]:
        doc = module.__doc__.split("\n\n")[0]
        p = kinds.add_parser(name, help=text, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_cli_args(p)
        p.set_defaults(bench_main=module.main)
        parsers[f"bench {name}"] = p
    return parsers


def _serve_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """`rawpage serve`: --model, --host, --port and --api-key first in --help, then the rest."""
    from rawpage.server.args import add_server_args
    from rawpage.server.vllm_flags import add_vllm_flags

    serve = sub.add_parser("serve", help="start the OpenAI-compatible HTTP server")
    serve.add_argument("model_tag", nargs="?", metavar="MODEL", help="the model, as --model (vLLM's positional form)")
    first = serve.add_argument_group("model and address")
    add_flag(first, EngineArgs, "model")
    add_server_args(serve, first)
    EngineArgs.add_cli_args(serve, skip=("model",))
    ray = serve.add_argument_group("replicas on Ray Serve (pip install 'rawpage[ray]'; rawpage/server/serve_ray.py)")
    ray.add_argument("--ray", action="store_true", help="serve replicas on Ray Serve (a local Ray, or RAY_ADDRESS's)")
    ray.add_argument("--num-replicas", type=int, default=None, help="with --ray: replicas of the model (default: 1)")
    ray.add_argument("--max-replicas", type=int, default=None, help="with --ray: autoscale up to this many replicas")
    add_vllm_flags(serve)
    return serve


def _parse(
    parser: argparse.ArgumentParser, commands: dict[str, argparse.ArgumentParser], argv: list[str] | None
) -> argparse.Namespace:
    args, extra = parser.parse_known_args(dashed(sys.argv[1:] if argv is None else argv))
    command = commands[" ".join(filter(None, [args.command, getattr(args, "bench_command", None)]))]
    if extra:
        command.error(f"unrecognized arguments: {' '.join(extra)}")
    tag = getattr(args, "model_tag", None)
    if tag is not None:
        if args.model not in (None, tag):
            command.error(f"the model is given twice: {tag} and --model {args.model}")
        args.model = tag
    return args


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=256, help="most tokens to generate (default: 256)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: 0)")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--sampling-seed", type=int, default=None, help="seed for this request's sampling")


def _engine(args: argparse.Namespace):
    from rawpage.engine import LLMEngine

    logging.getLogger("rawpage").setLevel(logging.WARNING)
    return LLMEngine(EngineArgs.from_cli_args(args).replace(log_stats_interval=0))


def _params(args: argparse.Namespace):
    from rawpage.sampling_params import SamplingParams

    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.sampling_seed,
    )


@contextlib.contextmanager
def _ctrl_c_flag():
    """While a reply streams, Ctrl-C sets a flag instead of raising KeyboardInterrupt: the
    step loop checks it between steps. Raised, the interrupt could land inside a library
    call (the tokenizer, BLAS) that turns it into an ordinary error, which the engine then
    reports as the request's failure rather than a stop. (Only the main thread can set a
    signal handler; elsewhere Ctrl-C keeps its default.)"""
    pressed = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield pressed
        return
    previous = signal.signal(signal.SIGINT, lambda *_: pressed.set())
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, previous)


def _stream(engine, prompt, params) -> str:
    """Run one request, printing text deltas as they arrive; Ctrl-C aborts just this reply."""
    rid = uuid.uuid4().hex
    engine.add_request(rid, prompt, params)
    text = []
    with _ctrl_c_flag() as pressed:
        while engine.has_unfinished_requests() and not pressed.is_set():
            for out in engine.step():
                delta = out.outputs[0].delta_text if out.outputs else ""
                print(delta, end="", flush=True)
                text.append(delta)
        if pressed.is_set():
            engine.abort_request(rid)
            while engine.has_unfinished_requests():
                engine.step()
            print(" [stopped]", end="")
    print(flush=True)
    return "".join(text)


def _generate(args: argparse.Namespace) -> int:
    if not args.prompt:
        raise ValueError("the prompt is empty")
    engine = _engine(args)
    prompt = args.prompt
    if args.chat:
        tok = engine.tokenizer
        text = tok.apply_chat_template([{"role": "user", "content": prompt}], chat_template=engine.chat_template)
        prompt = {"prompt_token_ids": tok.encode(text, add_special_tokens=False)}
    _stream(engine, prompt, _params(args))
    return 0


def _chat(args: argparse.Namespace) -> int:
    engine = _engine(args)
    tok = engine.tokenizer
    history = [{"role": "system", "content": args.system}] if args.system else []
    print("rawpage chat: type a message; Ctrl-C stops a reply, Ctrl-D quits.", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            print()
            return 0
        except KeyboardInterrupt:
            print()
            continue
        if not line.strip():
            continue
        history.append({"role": "user", "content": line})
        text = tok.apply_chat_template(history, chat_template=engine.chat_template)
        reply = _stream(engine, {"prompt_token_ids": tok.encode(text, add_special_tokens=False)}, _params(args))
        history.append({"role": "assistant", "content": reply})


if __name__ == "__main__":
    sys.exit(main())
