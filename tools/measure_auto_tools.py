"""How often a model calls a tool under `tool_choice: "auto"` when the request needs one
(and, for contrast, which tool it picks when a grammar makes it call one: --tool-choice required).

Sends 20 chat requests, each of which a tool answers (weather, time, conversion, search,
arithmetic, e-mail, ...), with five tools offered, to a running OpenAI-compatible server,
and counts the replies that came back with `message.tool_calls`, those that named the
right function, and those whose text holds a `<tool_call>` the server's parser did not
turn into a call.

    rawpage serve &                                   # the default SmolLM2-135M-Instruct
    python tools/measure_auto_tools.py --url http://127.0.0.1:8000
    python tools/measure_auto_tools.py --url ... --temperature 0.7 --seed 1 --json out.json

README "Tool calling" quotes the figures this printed, with the machine and command.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import httpx


def _fn(name: str, description: str, **params: str) -> dict:
    props = {k: {"type": "string", "description": v} for k, v in params.items()}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": props, "required": list(params)},
        },
    }


TOOLS = [
    _fn("get_weather", "Get the current weather in a city", city="the city name"),
    _fn("get_time", "Get the current local time in a city", city="the city name"),
    _fn("convert_currency", "Convert an amount between currencies", amount="the amount", src="from", dst="to"),
    _fn("web_search", "Search the web and return the top results", query="what to search for"),
    _fn("send_email", "Send an e-mail", to="the address", subject="the subject", body="the text"),
]

# (the user's message, the tool that answers it)
PROMPTS = [
    ("What's the weather like in Paris right now?", "get_weather"),
    ("Is it raining in London today?", "get_weather"),
    ("How hot is it in Cairo at the moment?", "get_weather"),
    ("Tell me the current temperature in Tokyo.", "get_weather"),
    ("What time is it now in New York?", "get_time"),
    ("What's the local time in Sydney?", "get_time"),
    ("Is it morning or evening in Berlin right now?", "get_time"),
    ("Convert 100 US dollars to euros.", "convert_currency"),
    ("How many Japanese yen is 50 British pounds today?", "convert_currency"),
    ("I have 2000 Swiss francs; what is that in US dollars?", "convert_currency"),
    ("Search the web for the latest news about the Mars rover.", "web_search"),
    ("Find recent articles about quantum computing breakthroughs.", "web_search"),
    ("Who won yesterday's football match between Spain and Italy? Look it up.", "web_search"),
    ("Look up the opening hours of the Louvre museum.", "web_search"),
    ("What is the current price of Bitcoin? Search for it.", "web_search"),
    ("Send an email to alice@example.com saying the meeting moved to 3pm.", "send_email"),
    ("Email bob@example.com with the subject 'Invoice' and tell him it is paid.", "send_email"),
    ("Write to carol@example.com that I will be late tomorrow.", "send_email"),
    ("Check the weather in Madrid and tell me if I need an umbrella.", "get_weather"),
    ("What's the time in Mumbai right now?", "get_time"),
]


def measure(
    url: str, model: str | None, temperature: float, seed: int | None, max_tokens: int, choice: str = "auto"
) -> dict:
    rows = []
    with httpx.Client(base_url=url, timeout=300) as client:
        model = model or client.get("/v1/models").json()["data"][0]["id"]
        for text, want in PROMPTS:
            body = {
                "model": model,
                "messages": [{"role": "user", "content": text}],
                "tools": TOOLS,
                "tool_choice": choice,
                "temperature": temperature,
                "max_tokens": max_tokens,
            }
            if seed is not None:
                body["seed"] = seed
            t0 = time.monotonic()
            r = client.post("/v1/chat/completions", json=body)
            r.raise_for_status()
            msg = r.json()["choices"][0]["message"]
            calls = [c["function"]["name"] for c in msg.get("tool_calls") or []]
            rows.append(
                {
                    "prompt": text,
                    "want": want,
                    "calls": calls,
                    "raw_tool_call_tag": "<tool_call>" in (msg.get("content") or ""),
                    "content": (msg.get("content") or "")[:200],
                    "seconds": round(time.monotonic() - t0, 2),
                }
            )
            print(f"{'CALL' if calls else 'text'} {calls or ''} <- {text}", file=sys.stderr)
    n = len(rows)
    return {
        "model": model,
        "tool_choice": choice,
        "temperature": temperature,
        "prompts": n,
        "called_a_tool": sum(bool(r["calls"]) for r in rows),
        "called_the_right_tool": sum(r["want"] in r["calls"] for r in rows),
        "tag_in_text_not_parsed": sum(r["raw_tool_call_tag"] and not r["calls"] for r in rows),
        "rows": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default=None, help="default: the server's first model")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--tool-choice", default="auto", choices=["auto", "required"], help="required: for contrast")
    ap.add_argument("--json", default=None, help="also write every reply to this file")
    args = ap.parse_args()
    out = measure(args.url, args.model, args.temperature, args.seed, args.max_tokens, args.tool_choice)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    n = out["prompts"]
    print(
        f"{out['model']}, tool_choice {out['tool_choice']}, temperature {out['temperature']}: called a tool in "
        f"{out['called_a_tool']}/{n}, the right one in {out['called_the_right_tool']}/{n}; "
        f"<tool_call> in text but not parsed: {out['tag_in_text_not_parsed']}/{n}"
    )


if __name__ == "__main__":
    main()
