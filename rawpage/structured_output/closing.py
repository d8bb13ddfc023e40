"""Closing in time: a constrained reply that runs into max_tokens (or the context limit) is
cut mid-grammar, and a JSON reply cut there does not parse. A schema's strings and arrays
without maxLength / maxItems let a model write until the limit, so each constrained
sequence looks ahead: once its remaining tokens come close to the fewest it needs to end
the grammar, it is made to write that shortest ending (then EOS).

llguidance has no "shortest completion" call, so we search for one with the matcher
itself: a breadth-first search over its states, whose edges are its forced tokens when
it has some (a property name), else the single-character tokens it allows (each of
JSON's structural characters, and one other punctuation character or space, one letter of
each case and one digit; other tokens only where none of those is allowed). States one step deep with the same allowed-token mask
are taken as one (every character inside a free string leads to the same place), which
keeps the search to a few dozen states. The ending found is then written in as few
tokens as the tokenizer allows, if the matcher takes that spelling.

When: the sequence is forced once `remaining <= ending + 1 (EOS) + margin`, where the
margin is half the length of the grammar's shortest whole reply, at most MAX_MARGIN: one
token that opens a new element (an array item, an optional property) needs about as
much more, so forcing starts a little before the last moment (and a short grammar, a
choice, is not forced from its first token). A reply that ends before that
point is untouched: the search never changes a mask before forcing starts."""

from __future__ import annotations

import string
from typing import Any

import numpy as np

MAX_MARGIN = 8  # tokens kept beyond the ending found, at most
MAX_NODES = 2000  # matcher states one search may visit; past that, no forcing (as before)
STRUCTURAL = '"}]),:{[-'  # characters tried one by one; of the others, one of each kind
EVERY_STEP = 32  # slack (tokens) under which the ending is searched at every step


class Closer:
    """Shared by a compiler's sequences: the single-character tokens and the tokenizer."""

    def __init__(self, encode, decode, eos_token_ids: list[int], vocab_size: int) -> None:
        self.encode, self.decode, self.eos = encode, decode, list(eos_token_ids)
        self.vocab_size = vocab_size
        self.chars: dict[str, int] = {}
        for c in string.punctuation + string.ascii_letters + string.digits + " ":
            ids = encode(c)
            if len(ids) == 1 and ids[0] < vocab_size:
                self.chars[c] = ids[0]
        self._punct = [self.chars[c] for c in STRUCTURAL if c in self.chars]
        other = "".join(c for c in string.punctuation + " " if c not in STRUCTURAL)
        groups = (other, string.ascii_lowercase, string.ascii_uppercase, string.digits)
        self._groups = [[self.chars[c] for c in g if c in self.chars] for g in groups]

    def _edges(self, matcher: Any, allowed: np.ndarray) -> list[list[int]]:
        ff = matcher.compute_ff_tokens()
        if ff:
            return [list(ff)]
        edges = [[t] for t in self._punct if allowed[t]]
        for group in self._groups:
            first = next((t for t in group if allowed[t]), None)
            if first is not None:
                edges.append([first])
        if not edges:  # nothing single-character: a few of what the grammar allows
            eos = set(self.eos)
            edges = [[int(t)] for t in np.flatnonzero(allowed)[:8] if int(t) not in eos]
        return edges

    def shortest_ending(self, matcher: Any) -> list[int] | None:
        """The fewest tokens found that take `matcher` (not advanced) to an accepting
        state: [] if it is accepting now, None if none was found within MAX_NODES."""
        if matcher.is_accepting():
            return []
        frontier, nodes = [(matcher.deep_copy(), [])], 0
        while frontier and nodes < MAX_NODES:
            seen, deeper = set(), []
            for m, path in frontier:
                bits = m.compute_bitmask()
                if (bits, m.is_accepting()) in seen:
                    continue
                seen.add((bits, m.is_accepting()))
                allowed = np.unpackbits(np.frombuffer(bits, np.uint8), bitorder="little")[: self.vocab_size].view(bool)
                for edge in self._edges(m, allowed):
                    nodes += 1
                    child = m.deep_copy()
                    if child.try_consume_tokens(edge) != len(edge) or child.is_error():
                        continue
                    if child.is_accepting():
                        return self._respell(matcher, path + edge)
                    deeper.append((child, path + edge))
            frontier = deeper
        return None

    def _respell(self, matcher: Any, path: list[int]) -> list[int]:
        """`path`, or the tokenizer's shorter spelling of the same text if the grammar takes it."""
        ids = self.encode(self.decode(path))
        if len(ids) < len(path):
            m = matcher.deep_copy()
            if m.try_consume_tokens(ids) == len(ids) and m.is_accepting():
                return ids
        return path


class Ending:
    """One sequence's look-ahead (GrammarState owns it; forked with it). `budget` is the
    number of tokens the sequence may still write, this step's included."""

    def __init__(self, closer: Closer) -> None:
        self.closer = closer
        self.margin: int | None = None  # set at the first check: the shortest whole reply
        self.plan: list[int] | None = None  # the ending being written, once forced
        self.next_check = 0  # check again once the budget is at or below this

    def fork(self) -> Ending:
        child = Ending(self.closer)
        child.margin, child.next_check = self.margin, self.next_check
        child.plan = list(self.plan) if self.plan is not None else None
        return child

    def forced(self, matcher: Any, budget: int | None) -> list[int] | None:
        """The tokens the sequence must take now (the ending's next, or EOS once it is
        written), or None while it may write freely."""
        if self.plan is None and budget is not None and (self.margin is None or budget <= self.next_check):
            ending = self.closer.shortest_ending(matcher)
            if ending is None:
                self.next_check = budget - 1
                return None
            if self.margin is None:
                self.margin = min(MAX_MARGIN, len(ending) // 2)
            slack = budget - (len(ending) + 1 + self.margin)
            if slack <= 0:
                self.plan = ending
            else:  # again once half the slack is spent, and at every step near the end
                self.next_check = budget - 1 if slack <= EVERY_STEP else budget - slack // 2
        if self.plan is None:
            return None
        return self.plan[:1] if self.plan else list(self.closer.eos)

    def accept(self, token_id: int) -> None:
        if self.plan:
            self.plan = self.plan[1:] if token_id == self.plan[0] else None
