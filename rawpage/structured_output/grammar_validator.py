"""Grammar validation in a child process, where an llguidance crash costs only the child.

llguidance can overflow its stack on a grammar the gate (grammar_limits.py) does not
count (SECURITY.md). The parent hands each new grammar text to a small persistent child,

    python -m rawpage.structured_output.grammar_validator      stdin: frames in, stdout: frames out

which holds its own LLTokenizer (built from the tokenizer's JSON, sent first) and answers
llguidance's verdict: "" for valid, else the error. If the child dies or runs past the
time limit, the parent kills it, starts a fresh one for the next grammar, and refuses
this one as too complex. The parent compiles only grammars a child accepted, on threads
with COMPILE_STACK_BYTES, 4x the child's: whatever passed here has that margin there.

A frame is a 4-byte big-endian length, then that many bytes of UTF-8.
"""

from __future__ import annotations

import json
import os
import select
import struct
import subprocess
import sys
import threading
import time
from typing import BinaryIO

VALIDATE_STACK_BYTES = 8 << 20  # the child's validation thread: llguidance overflows it at ~900 chained $refs
COMPILE_STACK_BYTES = 32 << 20  # the parent's compile threads (grammar_compiler.py)
STARTUP_TIMEOUT = 60.0  # seconds for a child to import llguidance and build its tokenizer


class GrammarTooComplexError(Exception):
    """The child crashed on the grammar or ran out of time."""


def write_frame(out: BinaryIO, data: bytes) -> None:
    out.write(struct.pack(">I", len(data)) + data)
    out.flush()


def read_frame(inp: BinaryIO) -> bytes | None:
    """The next frame, or None at end of input."""
    head = inp.read(4)
    if len(head) < 4:
        return None
    return inp.read(struct.unpack(">I", head)[0])


class GrammarValidator:
    """One child process, started on first use and again after each death. One caller at a time."""

    def __init__(self, setup: bytes, timeout: float) -> None:
        self.setup, self.timeout = setup, timeout  # setup: the child's tokenizer, as a JSON frame
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def validate(self, grammar: str) -> str:
        """llguidance's verdict on `grammar` ("" when valid); GrammarTooComplexError if
        the child died on it or took longer than the timeout."""
        with self._lock:
            proc = self._proc or self._start()
            try:
                write_frame(proc.stdin, grammar.encode())
                return self._read(proc, self.timeout).decode()
            except (OSError, GrammarTooComplexError) as e:
                self.close()
                raise GrammarTooComplexError(str(e) or "the grammar validator died") from None

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def _start(self) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "rawpage.structured_output.grammar_validator"]
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self._proc = proc
        try:
            write_frame(proc.stdin, self.setup)
            self._read(proc, STARTUP_TIMEOUT)  # "ready"
        except (OSError, GrammarTooComplexError) as e:
            self.close()
            raise RuntimeError(f"the grammar validator process did not start: {e}") from None
        return proc

    def _read(self, proc: subprocess.Popen, timeout: float) -> bytes:
        """One frame from the child within `timeout` seconds."""
        fd, buf, deadline = proc.stdout.fileno(), b"", time.monotonic() + timeout
        while len(buf) < 4 or len(buf) < 4 + struct.unpack(">I", buf[:4])[0]:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise GrammarTooComplexError(f"it took over {timeout:g} s")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise GrammarTooComplexError(f"llguidance crashed on it, exit code {proc.wait()}")
            buf += chunk
        return buf[4:]


def _serve(inp: BinaryIO, out: BinaryIO) -> None:
    """The child: build the tokenizer, then answer one verdict per grammar until stdin closes."""
    from llguidance import LLMatcher, LLTokenizer

    setup = json.loads(read_frame(inp) or b"{}")
    ll = LLTokenizer(setup["tokenizer"], n_vocab=setup["vocab_size"], eos_token=setup["eos_token_ids"])
    write_frame(out, b"ready")
    threading.stack_size(VALIDATE_STACK_BYTES)  # the same stack whatever this machine's ulimit -s
    while (frame := read_frame(inp)) is not None:
        verdict: list[str] = []
        worker = threading.Thread(target=_verdict, args=(LLMatcher, frame.decode(), ll, verdict))
        worker.start()
        worker.join()
        write_frame(out, verdict[0].encode())


def _verdict(matcher_cls: type, grammar: str, ll: object, out: list[str]) -> None:
    try:
        out.append(matcher_cls.validate_grammar(grammar, ll))
    except Exception as e:  # noqa: BLE001 - any refusal is the grammar's fault, reported as such
        out.append(f"{type(e).__name__}: {e}")


if __name__ == "__main__":
    _serve(sys.stdin.buffer, sys.stdout.buffer)
