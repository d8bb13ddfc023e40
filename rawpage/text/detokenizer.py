"""Incremental detokenization: turn one new token at a time into new text.

Decoding token by token is wrong twice over: a character can span several
tokens (UTF-8 bytes of an emoji split across byte-level tokens), and a
SentencePiece decoder strips the leading space of the first token it sees.
So we keep a small window of earlier tokens, decode the window with and without
the new tokens, and emit the difference once it no longer ends in an incomplete
character (U+FFFD). This is the scheme vLLM and TGI use; as vLLM, the bytes of a
character that a special token or the end cuts short are dropped, never a stray U+FFFD.
"""

from __future__ import annotations

from rawpage.text.tokenizer import Tokenizer

# Tokens of left context kept in the decode window; enough for any merge effect.
_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int], skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids = list(prompt_ids[-_CONTEXT_TOKENS:])  # the decode window
        self.read_offset = len(self.ids)  # window tokens before this are already emitted
        self.text = ""  # everything emitted so far

    def add(self, token_ids: list[int]) -> str:
        """Append generated tokens; return the text they complete (possibly ""). An
        incomplete character is held back, and dropped if a special token comes next."""
        held = len(self.ids) > self.read_offset  # tokens not yet emitted: an incomplete character
        self.ids.extend(token_ids)
        prefix = self.tokenizer.decode(self.ids[: self.read_offset], self.skip_special_tokens)
        full = self.tokenizer.decode(self.ids, self.skip_special_tokens)
        if held and not self.skip_special_tokens and not self.tokenizer.decode(token_ids[:1]):
            before = self.tokenizer.decode(self.ids[: -len(token_ids)], False)  # ends in U+FFFD
            full = before.rstrip("\ufffd") + full[len(before) :] if full.startswith(before) else full
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""  # nothing printable yet: wait for the rest of the character
        delta = full[len(prefix) :]
        # Slide the window: the tokens just emitted become the next left context.
        self.ids = self.ids[self.read_offset :]
        self.read_offset = len(self.ids)
        self.text += delta
        return delta


def complete_text(tokenizer: Tokenizer, ids: list[int], skip_special_tokens: bool) -> str:
    """A finished sequence's text less a character its last (at most 3) tokens left incomplete."""
    cut = 0
    while (text := tokenizer.decode(ids[: len(ids) - cut], skip_special_tokens)).endswith("\ufffd") and cut < 3:
        cut += 1
    return text
