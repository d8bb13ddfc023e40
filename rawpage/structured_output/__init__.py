"""Structured outputs: grammars that decide which tokens a sequence may sample next.

A request's constraint (a JSON schema, `json_object`, a regex, a choice of strings,
or a Lark grammar) is compiled by llguidance into a matcher bound to our tokenizer, off
the engine thread and once per grammar (grammar_compiler.py, behind the limits of
grammar_limits.py). Each constrained sequence owns a copy of that matcher, advanced by every token it appends, so
its state follows the sequence through forks (n > 1, beam search), preemption
(recompute or swap: the matcher depends only on the tokens, never on the KV cache)
and prefix caching.

Per step, the allowed-token bitmask of every constrained sequence is computed on a
worker thread while the forward pass runs (llguidance releases the GIL; MaskPrefetcher
in grammar_compiler.py), and the sampler turns it into -inf logits before temperature,
top-k and top-p (apply_masks). Sequences without a constraint never touch any of this.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rawpage.errors import InvalidRequestError
from rawpage.structured_output.closing import Ending
from rawpage.structured_output.reasoning_gate import MAYBE, OPEN, THINKING, ReasoningGate
from rawpage.structured_output.schema_rewrite import cap_numbers

# Our JSON: no free whitespace between tokens. A small model offered "any whitespace"
# happily emits newlines until max_tokens; compact JSON is still valid JSON.
_JSON_OPTIONS = {"whitespace_flexible": False}


@dataclass
class StructuredOutputsParams:
    """vLLM's names: exactly one of json, regex, choice, grammar, json_object.

    `reasoning`: the (start, end) tags of a reasoning model's think block: the sequence
    samples freely inside one, and the constraint applies outside it (reasoning_gate.py)."""

    json: dict[str, Any] | str | None = None  # a JSON schema (object or its JSON text)
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None  # Lark (llguidance's dialect), or GBNF-like EBNF via lark
    json_object: bool = False  # any JSON object
    reasoning: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        given = [n for n in ("json", "regex", "choice", "grammar") if getattr(self, n) is not None]
        given += ["json_object"] if self.json_object else []
        if len(given) != 1:
            raise InvalidRequestError(
                f"structured_outputs needs exactly one of json, regex, choice, grammar, json_object; got "
                f"{', '.join(given) or 'none'}",
                "structured_outputs",
            )
        if self.choice is not None and (
            not isinstance(self.choice, list) or not self.choice or not all(isinstance(c, str) for c in self.choice)
        ):
            raise InvalidRequestError("structured_outputs.choice must be a non-empty list of strings", "choice")

    # (GrammarLimits, grammar text) once GrammarCompiler.check passed it: prompts sharing it pay once
    _checked: tuple[Any, str] | None = field(default=None, init=False, repr=False, compare=False)

    def schema(self) -> Any:
        """The JSON schema, parsed (None for the other kinds)."""
        if self.json_object:
            return {"type": "object"}
        return json.loads(self.json) if isinstance(self.json, str) else self.json

    def to_grammar(self, schema: Any = None) -> str:
        """The llguidance grammar text for this constraint (`schema`: self.schema(), if known).
        A schema's integers and numbers without bounds are capped at 16 digits (schema_rewrite.py)."""
        from llguidance import LLMatcher

        if self.json is not None or self.json_object:
            return LLMatcher.grammar_from_json_schema(cap_numbers(schema or self.schema()), defaults=_JSON_OPTIONS)
        if self.regex is not None:
            return LLMatcher.grammar_from_regex(self.regex)
        if self.choice is not None:
            return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in self.choice))
        return LLMatcher.grammar_from_lark(self.grammar or "")


class GrammarState:
    """One sequence's position in its grammar. `accept` is called with every token the
    sequence appends. `compiled` is the Future[CompiledGrammar] from GrammarCompiler:
    the scheduler admits the sequence only once it is `ready`. `gate` (a ReasoningGate,
    or None: constrained from the start) says whether the sequence is thinking; `matcher`
    is None while it is, else a copy of the compiled matcher."""

    def __init__(self, compiler: Any, compiled: Future, gate: ReasoningGate | None = None) -> None:
        self.compiler, self.compiled, self.gate = compiler, compiled, gate
        self._matcher: Any = None
        self.ending = Ending(compiler.closer)  # the look-ahead that closes it before the length limit
        self.error: str | None = None  # why the matcher reached its error state mid-output, if it did

    @property
    def ready(self) -> bool:
        """Compiled without error (a failed compile is the engine's to report, not to run)."""
        return self.compiled.done() and self.compiled.exception() is None

    @property
    def open(self) -> bool:
        """The grammar applies to the next token (it may still allow a start tag: MAYBE)."""
        return self.gate is None or self.gate.phase != THINKING

    @property
    def matcher(self) -> Any:
        if self._matcher is None and self.open:
            self._matcher = self.compiled.result().fresh()  # a copy of the cached matcher, never a compile
        return self._matcher

    def accept(self, token_id: int) -> None:
        gate = self.gate
        if gate is None or gate.phase == OPEN or (gate.phase == MAYBE and not gate.opens_block(token_id)):
            self.matcher.consume_token(token_id)  # a refused token leaves it in its error state: only EOS
            self.ending.accept(token_id)
        if gate is not None and gate.phase != OPEN:
            gate.accept(token_id)
            if gate.phase == THINKING:
                self._matcher = None  # the answer starts from a fresh copy once the block closes
                self.ending = Ending(self.compiler.closer)

    def fork(self) -> GrammarState:
        child = GrammarState(self.compiler, self.compiled, self.gate.fork() if self.gate else None)
        child.error = self.error
        child.ending = self.ending.fork()
        child._matcher = self._matcher.deep_copy() if self._matcher is not None else None
        return child

    def mask(self, budget: int | None = None) -> np.ndarray | None:
        """The allowed-token bitmask, (W,) int32 with bit t = token t; None when the sequence
        is unconstrained this step. `budget`: the tokens it may still write, this one
        included (None: no limit); near it, only the grammar's shortest ending (closing.py)."""
        if self.matcher is None:
            return None
        out = np.zeros(self.compiler.words, dtype=np.int32)
        tag = self.gate.extra_mask() if self.gate is not None else None
        self.matcher.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)
        if tag is not None:
            out |= tag  # the first token: the grammar's, or one that opens a think block
        elif self.matcher.is_error() or not out.any():
            # A refused token left the matcher in its error state: it allows EOS at most. Let
            # the sequence end there (never sample NaN); `error` makes that end "length",
            # not a valid-looking "stop" (output_processor.py).
            self.error = self.error or (self.matcher.get_error() or "the grammar allows no next token").splitlines()[0]
            _set_bits(out, self.compiler.eos_token_ids)
        elif (forced := self.ending.forced(self.matcher, budget)) is not None:
            out[:] = 0
            _set_bits(out, forced)
        return out


def _set_bits(row: np.ndarray, tokens: list[int]) -> None:
    for t in tokens:
        row.view(np.uint8)[t >> 3] |= 1 << (t & 7)  # bit t of the little-endian row


def apply_masks(logits: np.ndarray, seqs: list, mask_of: Callable[[Any], np.ndarray | None] | None = None) -> None:
    """-inf every token a constrained sequence's grammar forbids. logits: (N, V) in place.
    mask_of(seq): its (W,) int32 bitmask, or None where the grammar allows anything
    (the engine's MaskPrefetcher.mask, grammar_compiler.py); GrammarState.mask without one.
    All constrained rows at once: one unpack of (R, W) words into (R, V) bits."""
    rows, masks = [], []
    for i, s in enumerate(seqs):
        if getattr(s, "grammar", None) is None:
            continue
        mask = mask_of(s) if mask_of is not None else s.grammar.mask()
        if mask is not None:
            rows.append(i)
            masks.append(mask)
    if not rows:
        return
    V = logits.shape[1]
    allowed = np.unpackbits(np.stack(masks).view(np.uint8), axis=1, bitorder="little")[:, :V].view(bool)  # (R, V)
    whole = len(rows) == len(logits)  # every row constrained: edit in place, no gather/scatter copies
    target = logits if whole else logits[rows]
    target[~allowed] = -np.inf
    # A ban from earlier (min_tokens on EOS when the grammar allows only EOS) could leave
    # nothing: the grammar wins, uniformly, rather than sampling from an all -inf row.
    dead = np.isneginf(target.max(axis=1))
    if dead.any():
        target[dead] = np.where(allowed[dead], 0.0, -np.inf)
    if not whole:
        logits[rows] = target
