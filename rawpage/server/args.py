"""Flags of `rawpage serve` that are about HTTP rather than the engine."""

from __future__ import annotations

import argparse


def add_server_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("server")
    g.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind; 0.0.0.0 exposes the server to the network",
    )
    g.add_argument("--port", type=int, default=8000, help="port to listen on")
    g.add_argument("--api-key", help="require 'Authorization: Bearer <key>' on /v1 endpoints")
    g.add_argument(
        "--max-request-bytes",
        type=int,
        default=4 << 20,
        help="reject request bodies larger than this",
    )
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
