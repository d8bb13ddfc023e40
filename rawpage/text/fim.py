"""Fill-in-the-middle: a model's FIM tokens, and the prompt that asks for the middle.

Code models trained for FIM read the code before and after a gap and write the gap:

    [BOS] [REP]myproject\\n [SEP]file\\nchunk ... [SEP]filename\\n [PRE]prefix [SUF]suffix [MID] -> middle

REP and SEP (repository-level FIM, Qwen2.5-Coder and StarCoder2) are there only for
models that have them, with the extra files as context. The tokens come from a GGUF's
tokenizer.ggml.fim_*_token_id, else from the vocabulary under the names each family
gives them. The middle ends at EOS, at CodeLlama's EOT, or where the model starts a
new file (SEP, REP) or pads (PAD): those become stop tokens of a FIM request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# role -> the token names of Qwen2.5-Coder, StarCoder2 and friends, DeepSeek-Coder (two
# spellings of its bars), CodeLlama (SentencePiece's ▁ and without)
FIM_TOKEN_NAMES = {
    "pre": ("<|fim_prefix|>", "<fim_prefix>", "<fim-prefix>", "<｜fim▁begin｜>", "<|fim▁begin|>", "▁<PRE>", "<PRE>"),
    "suf": ("<|fim_suffix|>", "<fim_suffix>", "<fim-suffix>", "<｜fim▁hole｜>", "<|fim▁hole|>", "▁<SUF>", "<SUF>"),
    "mid": ("<|fim_middle|>", "<fim_middle>", "<fim-middle>", "<｜fim▁end｜>", "<|fim▁end|>", "▁<MID>", "<MID>"),
    "pad": ("<|fim_pad|>", "<fim_pad>", "<fim-pad>"),
    "rep": ("<|repo_name|>", "<repo_name>", "<reponame>"),
    "sep": ("<|file_sep|>", "<file_sep>"),
    "eot": ("▁<EOT>", "<EOT>"),
}


@dataclass(frozen=True)
class FimTokens:
    """A model's FIM token ids: pre, suf and mid are needed, the rest optional."""

    pre: int
    suf: int
    mid: int
    pad: int | None = None
    rep: int | None = None  # repository name: repository-level FIM
    sep: int | None = None  # file separator: the extra files' headers
    eot: int | None = None  # CodeLlama's end of the middle

    @classmethod
    def find(cls, token_to_id: Callable[[str], int | None], gguf_ids: dict[str, int] | None = None) -> FimTokens | None:
        """The ids a GGUF names (gguf_ids: role -> id), else the vocabulary's; None
        when the model lacks any of pre, suf and mid."""
        ids = dict(gguf_ids or {})
        for role, names in FIM_TOKEN_NAMES.items():
            if ids.get(role) is None:
                ids[role] = next((i for i in map(token_to_id, names) if i is not None), None)
        if any(ids[r] is None for r in ("pre", "suf", "mid")):
            return None
        return cls(**ids)

    @property
    def stop_token_ids(self) -> list[int]:
        """Where the middle ends, besides EOS."""
        return [t for t in (self.eot, self.pad, self.sep, self.rep) if t is not None]


def fim_prompt(
    fim: FimTokens,
    encode: Callable[[str], list[int]],
    prefix: str,
    suffix: str,
    prompt: str = "",
    extra: tuple[tuple[str, str], ...] = (),
    bos: int | None = None,
    budget: int | None = None,
    repo_level: bool = False,
) -> tuple[list[int], bool]:
    """(token ids, truncated): the FIM prompt for prefix + prompt | suffix, with extra
    (filename, text) files first in the repository-level form (repo_level: llama-server's
    /infill; /v1/completions' suffix is the plain form continue.dev writes). `prompt` continues the prefix (llama-server's /infill:
    the editor's current line up to the cursor). Past `budget` tokens, the prefix keeps
    its end (the code nearest the gap, at least 3/4 of the room), the suffix its start,
    and the extra files what room is left, nearest last, as llama-server trims them."""
    head = [bos] if bos is not None else []
    extra_ids = _repository(fim, encode, extra) if repo_level else []
    pre, tail, suf = encode(prefix), encode(prompt), encode(suffix)
    fixed = len(head) + len(tail) + 3
    room = None if budget is None else max(budget - fixed, 0)
    truncated = room is not None and len(pre) + len(suf) + len(extra_ids) > room
    if truncated:
        take_pre = min(len(pre), max(3 * room // 4, room - len(suf)))
        take_suf = min(len(suf), room - take_pre)
        take_extra = min(len(extra_ids), room - take_pre - take_suf)
        pre, suf = pre[len(pre) - take_pre :], suf[:take_suf]
        extra_ids = extra_ids[len(extra_ids) - take_extra :]
    ids = [*head, *extra_ids, fim.pre, *pre, *tail, fim.suf, *suf, fim.mid]
    return ids, truncated


def _repository(fim: FimTokens, encode: Callable[[str], list[int]], extra: tuple[tuple[str, str], ...]) -> list[int]:
    """The repository and its other files before the current one: [REP]myproject, then
    [SEP]name and text per file, then [SEP] for the current file (llama-server's names).
    A model without SEP gets each file after a plain-text snippet marker."""
    ids = [fim.rep, *encode("myproject\n")] if fim.rep is not None else []
    for filename, text in extra:
        ids += [fim.sep, *encode(filename + "\n")] if fim.sep is not None else encode("\n\n--- snippet ---\n\n")
        ids += encode(text)
    if fim.sep is not None:
        ids += [fim.sep, *encode("filename\n")]
    return ids
