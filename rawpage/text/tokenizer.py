"""Tokenizer: text <-> token ids, from a `tokenizer.json` or from GGUF metadata.

Both sources end up as one `tokenizers.Tokenizer` (the Rust library), so encode
and decode behave the same whichever file the model came from. GGUF files carry
the vocabulary itself; we rebuild the equivalent `tokenizers` pipeline:
  - `gpt2` vocabularies (byte-level BPE): vocab + merges, with the pre-tokenizer
    regexes llama.cpp uses for the file's `tokenizer.ggml.pre`;
  - `llama` vocabularies (SentencePiece BPE): merges derived from the token
    scores, byte fallback for unknown bytes, and "▁" for spaces.
"""

from __future__ import annotations

import functools
import itertools
import os
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from rawpage.errors import ModelLoadError, UnsupportedModelError
from rawpage.text.chat_template import ChatTemplate
from rawpage.text.fim import FimTokens

# llama.cpp's pre-tokenizer regexes (llama-vocab.cpp), keyed by `tokenizer.ggml.pre`.
_GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_TOKENIZER_REGEXES = {
    "default": [_GPT2_REGEX],
    "gpt2": [_GPT2_REGEX],
    "gpt-2": [_GPT2_REGEX],
    "smollm": [r"\p{N}", _GPT2_REGEX],
    "starcoder": [r"\p{N}", _GPT2_REGEX],
    "refact": [r"\p{N}", _GPT2_REGEX],
    "llama3": [_LLAMA3_REGEX],
    "llama-bpe": [_LLAMA3_REGEX],
    "dbrx": [_LLAMA3_REGEX],
    "smaug-bpe": [_LLAMA3_REGEX],
    "qwen2": [_QWEN2_REGEX],
    "stablelm2": [_QWEN2_REGEX],
}

# GGUF token types (gguf.TokenType)
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


class Tokenizer:
    """Encode, decode and chat-template for one model.

    `bos_token_id`/`eos_token_ids` follow the model's settings; `encode` adds BOS
    only when the model asks for it (the post-processor of `tokenizer.json`, or
    `tokenizer.ggml.add_bos_token`).
    """

    def __init__(
        self,
        hf: HFTokenizer,
        bos_token_id: int | None,
        eos_token_ids: list[int],
        chat_template: str | None,
        fim_ids: dict[str, int] | None = None,
    ) -> None:
        """fim_ids: the FIM token ids a GGUF names (role -> id); the vocabulary fills the rest."""
        self.hf = hf
        self.bos_token_id = bos_token_id
        self.eos_token_ids = eos_token_ids
        self.vocab_size = hf.get_vocab_size(with_added_tokens=True)
        self.bos_token = hf.id_to_token(bos_token_id) if bos_token_id is not None else None
        eos = eos_token_ids[0] if eos_token_ids else None
        self.eos_token = hf.id_to_token(eos) if eos is not None else None
        self.chat_template = ChatTemplate(chat_template) if chat_template else None
        self.fim = FimTokens.find(hf.token_to_id, fim_ids)  # None: the model cannot fill in the middle

    @functools.cached_property
    def longest_token_chars(self) -> int:
        """No token stands for more input characters than this (byte-level vocabularies
        write a character per byte, SentencePiece's ▁ is one space). One token at a time:
        get_vocab()'s dict is ~7 MB of temporaries at 49k tokens, which a server kept
        resident after its load."""
        texts = (self.hf.id_to_token(i) for i in range(self.hf.get_vocab_size(with_added_tokens=False)))
        added = (t.content for t in self.hf.get_added_tokens_decoder().values())
        return max(map(len, filter(None, itertools.chain(texts, added))), default=1)

    # --- encode / decode --------------------------------------------------

    # The _batch calls let go of Python's lock while they run (encode and decode hold it):
    # a server's other threads, its event loop too, go on meanwhile. For one text, as fast.
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.hf.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if len(ids) > 1024:  # 1 ms and more: worth the batch call's 2 µs
            return self.hf.decode_batch([ids], skip_special_tokens=skip_special_tokens)[0]
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self.hf.id_to_token(token_id)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        chat_template: str | ChatTemplate | None = None,
        **kwargs: Any,
    ) -> str:
        """Render a conversation to prompt text (tokenize it with add_special_tokens=False).
        `chat_template`, if given, replaces the model's: Jinja text (never a path) or a
        compiled ChatTemplate."""
        template = ChatTemplate(chat_template) if isinstance(chat_template, str) else chat_template
        template = template or self.chat_template
        if template is None:
            raise ValueError(
                "this model has no chat template; pass one with --chat-template "
                "(a file or a Jinja string), or use the completions API"
            )
        return template.render(
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            **kwargs,
        )

    # --- constructors -----------------------------------------------------

    @classmethod
    def from_hf_folder(cls, folder: str, eos_token_ids: list[int], cfg: dict[str, Any]) -> Tokenizer:
        """tokenizer.json from the folder; cfg is its tokenizer_config.json (or {})."""
        path = os.path.join(folder, "tokenizer.json")
        if not os.path.exists(path):
            raise ModelLoadError(f"{folder}: no tokenizer.json (rawpage reads the fast-tokenizer file)")
        try:
            hf = HFTokenizer.from_file(path)
        except Exception as e:
            raise ModelLoadError(f"{path}: cannot be read as a tokenizer ({e})") from None
        template = cfg.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t["name"]: t["template"] for t in template}
            template = named.get("default") or next(iter(named.values()), None)
        jinja = os.path.join(folder, "chat_template.jinja")
        if template is None and os.path.exists(jinja):
            with open(jinja) as f:
                template = f.read()
        bos_id = _token_id(hf, cfg.get("bos_token"))
        eos_id = _token_id(hf, cfg.get("eos_token"))
        eos_ids = list(eos_token_ids) or ([eos_id] if eos_id is not None else [])
        if eos_id is not None and eos_id not in eos_ids:
            eos_ids.append(eos_id)
        return cls(hf, bos_id, eos_ids, template)

    @classmethod
    def from_gguf(cls, meta: dict[str, Any]) -> Tokenizer:
        kind = meta.get("tokenizer.ggml.model")
        tokens: list[str] = meta.get("tokenizer.ggml.tokens") or []
        if not tokens:
            raise ModelLoadError("GGUF file has no tokenizer.ggml.tokens")
        types = meta.get("tokenizer.ggml.token_type") or [_NORMAL] * len(tokens)
        if kind == "gpt2":
            hf = _byte_level_bpe(tokens, meta.get("tokenizer.ggml.merges") or [], meta)
        elif kind == "llama":
            hf = _sentencepiece_bpe(tokens, meta.get("tokenizer.ggml.scores"), types, meta)
        else:
            raise UnsupportedModelError(f"unsupported GGUF tokenizer model {kind!r} (gpt2, llama)")
        hf.add_special_tokens(
            [
                AddedToken(t, special=True, normalized=False)
                for t, ty in zip(tokens, types)
                if ty in (_CONTROL, _USER_DEFINED) and t
            ]
        )
        bos = meta.get("tokenizer.ggml.bos_token_id")
        add_bos = meta.get("tokenizer.ggml.add_bos_token", kind == "llama")
        if add_bos and bos is not None:
            hf.post_processor = processors.TemplateProcessing(
                single=f"{tokens[bos]} $A",
                pair=f"{tokens[bos]} $A $B",
                special_tokens=[(tokens[bos], bos)],
            )
        eos = meta.get("tokenizer.ggml.eos_token_id")
        eos_ids = [eos] if eos is not None else []
        eot = meta.get("tokenizer.ggml.eot_token_id")
        if eot is not None and eot not in eos_ids:
            eos_ids.append(eot)
        fim = {
            role: meta.get(f"tokenizer.ggml.fim_{role}_token_id") for role in ("pre", "suf", "mid", "pad", "rep", "sep")
        }
        fim["eot"] = eot
        return cls(hf, bos, eos_ids, meta.get("tokenizer.chat_template"), fim)


def _byte_level_bpe(tokens: list[str], merges: list[str], meta: dict[str, Any]) -> HFTokenizer:
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZER_REGEXES:
        raise UnsupportedModelError(
            f"unsupported GGUF pre-tokenizer {pre!r}; known: {', '.join(sorted(_PRE_TOKENIZER_REGEXES))}"
        )
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    hf = HFTokenizer(models.BPE(vocab, pairs, fuse_unk=False, byte_fallback=False))
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in _PRE_TOKENIZER_REGEXES[pre]]
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    hf.decoder = decoders.ByteLevel()
    return hf


def _sentencepiece_bpe(
    tokens: list[str], scores: list[float] | None, types: list[int], meta: dict[str, Any]
) -> HFTokenizer:
    """SentencePiece BPE as `tokenizers` spells it.

    SentencePiece merges the adjacent pair whose merged piece has the highest
    score. That is ordinary BPE whose merge list is every (left, right) split of
    every vocabulary piece, ranked by the merged piece's score.
    """
    scores = scores or [0.0] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    mergeable = [i for i, ty in enumerate(types) if ty in (_NORMAL, _USER_DEFINED)]
    ranked = sorted(mergeable, key=lambda i: (-scores[i], i))
    merges = []
    for i in ranked:
        piece = tokens[i]
        splits = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab]
        merges += sorted(splits, key=lambda p: (vocab[p[0]], vocab[p[1]]))
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None else None
    hf = HFTokenizer(models.BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    add_prefix = meta.get("tokenizer.ggml.add_space_prefix", True)
    norm = [normalizers.Replace(" ", "▁")]
    if add_prefix:
        norm.insert(0, normalizers.Prepend("▁"))
    hf.normalizer = normalizers.Sequence(norm)
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    hf.decoder = decoders.Sequence(steps)
    return hf


def _token_id(hf: HFTokenizer, token: Any) -> int | None:
    if isinstance(token, dict):  # {"content": "<s>", ...}
        token = token.get("content")
    return hf.token_to_id(token) if isinstance(token, str) else None
