"""vLLM's long form of the server: `python -m rawpage.entrypoints.openai.api_server --model M
[flags]` is `rawpage serve --model M [flags]`, for scripts and images written for
`python -m vllm.entrypoints.openai.api_server`. It takes every `rawpage serve` flag."""

from __future__ import annotations

import sys

from rawpage import cli


def main(argv: list[str] | None = None) -> int:
    return cli.main(["serve", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
