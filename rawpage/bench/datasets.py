"""The requests a serving benchmark sends: a seeded random workload, or real-looking chats.

random: prompts of N words drawn from WORDS, N uniform in the input range, and an
    output length uniform in the output range (asked for with max_tokens, and with
    --ignore-eos exactly that many). Every word is one token after a space in SmolLM2's
    tokenizer (and in most BPE vocabularies), so N words are about N prompt tokens. The
    server's `usage` gives the true count, which is what the result reports. A prefix of
    --random-prefix-len words, the same for every request, goes before each prompt.
chat: rawpage/bench/data/chat_conversations.jsonl, one conversation per line. Each assistant
    turn becomes one request: the history before it is the prompt, and the length of
    the dataset's own reply sets max_tokens. Turns of one conversation share a prefix,
    as real multi-turn traffic does.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

CHAT_DATASET = Path(__file__).resolve().parent / "data" / "chat_conversations.jsonl"

# Common English words, each a single token when preceded by a space (checked against
# SmolLM2's vocabulary in tests/test_bench_serving.py).
WORDS = """
time year people way day man thing woman life child world school state family student group
country problem hand part place case week company system program question work government number
night point home water room mother area money story fact month lot right study book eye job word
business issue side kind head house service friend father power hour game line end member law car
city community name president team minute idea kid body information back parent face others level
office door health person art war history party result change morning reason research girl guy
moment air teacher force education foot boy age policy process music market sense nation plan
college interest death experience effect use class control care field development role effort
rate heart show leader light voice wife police mind price report decision son view town road arm
difference value building action model season society tax director position player record paper
space ground form event official matter center couple site project activity star table need court
oil situation cost industry figure street image phone data picture practice piece land product
doctor wall patient worker news test movie north love support technology step baby computer type
attention film tree source organization hair window evidence population truth song letter river
garden bread stone cloud summer winter spring ocean forest mountain island bridge train horse bird
fish apple coffee green blue red small large quick slow bright dark warm cold happy simple early
late open clear strong young old new good great little long high different important public able
sure free full special easy hard best real whole true local deep short wide rich quiet make take
come see know get give find think tell become leave feel bring begin keep hold write stand hear let
mean set meet run pay sit speak lead read grow lose fall send build stay carry walk talk watch
follow stop create learn move play live believe happen include continue turn start help call try
ask seem look want
""".split()


@dataclass
class BenchRequest:
    """One request of the workload, in both chat and plain-completion form."""

    messages: list[dict[str, str]]  # the conversation so far, ending with a user turn
    prompt: str  # the same as plain text, for /v1/completions
    output_tokens: int  # max_tokens to ask for; 0 until counted from `reference`
    reference: str = field(default="", repr=False)  # the dataset's reply that sets output_tokens


def add_length_args(g: argparse._ArgumentGroup, input_flag: str, output_flag: str) -> None:
    """The prompt and output length options, N or LO:HI (vLLM's defaults), and vLLM's
    --random-range-ratio, which widens a single N into a range (parse_range)."""
    g.add_argument(input_flag, default="1024", help="prompt tokens, N or LO:HI (default: %(default)s)")
    g.add_argument(output_flag, default="128", help="output tokens, N or LO:HI (default: %(default)s)")
    g.add_argument(
        "--random-range-ratio",
        type=float,
        default=0.0,
        help="lengths N are drawn from N(1 - r) to N(1 + r) (default: %(default)s)",
    )


def parse_range(text: str, ratio: float = 0.0) -> tuple[int, int]:
    """'LO:HI' -> (LO, HI); a single 'N' -> (N, N), or with vLLM's --random-range-ratio r
    the range N(1 - r) to N(1 + r)."""
    lo, _, hi = str(text).partition(":")
    try:
        bounds = (int(lo), int(hi or lo))
    except ValueError:
        raise ValueError(f"expected a length N or a range LO:HI, got {text!r}") from None
    if ratio and not hi:
        bounds = (max(1, math.floor(bounds[0] * (1 - ratio))), math.ceil(bounds[0] * (1 + ratio)))
    if not 1 <= bounds[0] <= bounds[1]:
        raise ValueError(f"length range {text!r} must satisfy 1 <= LO <= HI")
    return bounds


def random_requests(
    num: int, input_len: tuple[int, int], output_len: tuple[int, int], seed: int, prefix_len: int = 0
) -> list[BenchRequest]:
    rng = random.Random(seed)
    prefix = rng.choices(WORDS, k=prefix_len)
    out = []
    for _ in range(num):
        prompt = " ".join(prefix + rng.choices(WORDS, k=rng.randint(*input_len)))
        out.append(BenchRequest([{"role": "user", "content": prompt}], prompt, rng.randint(*output_len)))
    return out


def load_conversations(path: Path = CHAT_DATASET) -> list[list[dict[str, str]]]:
    """The conversations of a JSONL file with one {"messages": [...]} object per line."""
    convs = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            messages = json.loads(line)["messages"]
            if not any(m["role"] == "assistant" for m in messages):
                raise ValueError(f"{path}:{lineno}: a conversation needs an assistant turn")
            convs.append(messages)
    return convs


def chat_requests(
    num: int, seed: int, output_len: tuple[int, int] | None = None, path: Path = CHAT_DATASET
) -> list[BenchRequest]:
    """`num` requests drawn from every assistant turn of every conversation, shuffled.

    With `output_len`, max_tokens is drawn from that range; without it, it stays 0 and
    the caller sets it to the token length of `reference`, the dataset's own reply.
    """
    pool = []
    for messages in load_conversations(path):
        for i, m in enumerate(messages):
            if m["role"] == "assistant":
                pool.append((messages[:i], m["content"]))
    rng = random.Random(seed)
    rng.shuffle(pool)
    # Cycle through the pool when asked for more requests than it holds.
    picks = [pool[i % len(pool)] for i in range(num)]
    return [
        BenchRequest(history, transcript(history), rng.randint(*output_len) if output_len else 0, reply)
        for history, reply in picks
    ]


def transcript(messages: list[dict[str, str]]) -> str:
    """A chat as plain text for /v1/completions, ending where the assistant speaks next."""
    turns = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n\n".join(turns + ["Assistant:"])
