"""Tokenizers from tokenizer.json and from GGUF metadata; chat templates; incremental detokenization."""

import os

import numpy as np
import pytest

from rawpage.loader import load_checkpoint
from rawpage.text.chat_template import ChatTemplate, ChatTemplateError
from rawpage.text.detokenizer import IncrementalDetokenizer, complete_text
from rawpage.text.tokenizer import Tokenizer
from tests.tiny_models import (
    random_tensors,
    tiny_config,
    train_tokenizer,
    write_gguf,
    write_hf_folder,
)

TRICKY = [
    "Hello, world!",
    "   leading and trailing spaces   ",
    "tabs\tand\n\nnewlines\r\n  and    runs     of spaces",
    "日本語のテキスト 中文字符 한국어",
    "emoji 😀🎉🚀 👩‍👩‍👧‍👦 and flags 🇫🇷",
    "accents: café naïve Ünïcödé ß ø",
    "digits 0123456789 3.14159 1,000,000",
    "code: def f(x):\n\treturn x**2  # comment",
    "<|im_start|>user\nHi<|im_end|>",
    "",
]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory, default_checkpoint):
    d = tmp_path_factory.mktemp("tok")
    tok = train_tokenizer()
    cfg = tiny_config()
    tensors = random_tensors(cfg)
    hf = load_checkpoint(write_hf_folder(str(d / "hf"), cfg, tensors, tok)).tokenizer
    gg = load_checkpoint(write_gguf(str(d / "m.gguf"), cfg, tensors, tok)).tokenizer
    return {"default": default_checkpoint.tokenizer, "tiny-json": hf, "tiny-gguf": gg}


@pytest.mark.parametrize("name", ["default", "tiny-json", "tiny-gguf"])
@pytest.mark.parametrize("text", TRICKY)
def test_round_trip(tokenizers, name, text):
    tok = tokenizers[name]
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=False) == text


@pytest.mark.parametrize("name", ["default", "tiny-json", "tiny-gguf"])
def test_longest_token_chars_bounds_every_token(tokenizers, name):
    """The server refuses a prompt longer than max_model_len * this many characters."""
    tok = tokenizers[name]
    texts = [tok.hf.id_to_token(i) for i in range(tok.vocab_size)]
    assert tok.longest_token_chars == max(len(t) for t in texts if t is not None)


@pytest.mark.parametrize("text", TRICKY)
def test_json_and_gguf_tokenizers_agree(tokenizers, text):
    assert tokenizers["tiny-json"].encode(text) == tokenizers["tiny-gguf"].encode(text)


@pytest.mark.parametrize("name", ["default", "tiny-json", "tiny-gguf"])
def test_special_tokens(tokenizers, name):
    tok = tokenizers[name]
    ids = tok.encode("<|im_start|>user\nHi<|im_end|>", add_special_tokens=False)
    start, end = tok.hf.token_to_id("<|im_start|>"), tok.hf.token_to_id("<|im_end|>")
    assert ids[0] == start and ids[-1] == end
    assert tok.decode(ids, skip_special_tokens=True) == "user\nHi"


def test_default_model_bos_eos(default_checkpoint):
    tok = default_checkpoint.tokenizer
    assert tok.eos_token_ids == [2] and tok.bos_token_id == 1
    assert tok.encode("Hi")[0] != 1  # SmolLM2's GGUF says add_bos_token = false


@pytest.mark.parametrize("name", ["default", "tiny-gguf"])
@pytest.mark.parametrize("text", TRICKY)
def test_incremental_detokenization(tokenizers, name, text):
    tok = tokenizers[name]
    prompt = tok.encode("Say:", add_special_tokens=False)
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=False)
    deltas = [detok.add([i]) for i in ids]
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=False)
    assert not any("\ufffd" in d for d in deltas)


def test_incremental_detokenization_waits_for_whole_characters(default_checkpoint):
    tok = default_checkpoint.tokenizer
    ids = tok.encode("🎉", add_special_tokens=False)
    assert len(ids) > 1  # one character, several byte-level tokens
    detok = IncrementalDetokenizer(tok, [])
    assert [detok.add([i]) for i in ids] == [""] * (len(ids) - 1) + ["🎉"]


@pytest.mark.parametrize("skip", [True, False])
def test_a_character_cut_short_is_held_back_and_dropped_never_a_stray_fffd(default_checkpoint, skip):
    """vLLM holds the bytes of an incomplete character back and drops them when a special
    token or the end comes first: 'I love cats 🐱' + half of 🐶 + <|im_end|> has no U+FFFD."""
    tok = default_checkpoint.tokenizer
    ids = tok.encode("I love cats 🐱🐶", add_special_tokens=False)[:-1]  # 🐶 cut mid-way
    end = tok.encode("<|im_end|>", add_special_tokens=False)
    for seq, want in [(ids, "I love cats 🐱"), (ids + end, "I love cats 🐱" + ("" if skip else "<|im_end|>"))]:
        detok = IncrementalDetokenizer(tok, tok.encode("Say:"), skip_special_tokens=skip)
        assert "".join(detok.add([i]) for i in seq) == want
        assert complete_text(tok, ids, skip) == "I love cats 🐱"
    cut_space = tok.encode("I love cats 🐱", add_special_tokens=False)[:-2]  # ' \xf0\x9f': a space kept
    detok = IncrementalDetokenizer(tok, [], skip_special_tokens=False)
    assert "".join(detok.add([i]) for i in cut_space + end) == "I love cats <|im_end|>"


# --- SentencePiece vocabularies in GGUF -----------------------------------------------


def test_sentencepiece_gguf_vocab_matches_sentencepiece(tmp_path):
    spm = pytest.importorskip("sentencepiece")

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TRICKY * 20 + ["The quick brown fox jumps over the lazy dog."] * 50))
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(tmp_path / "sp"),
        vocab_size=400,
        model_type="bpe",
        character_coverage=0.98,
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        split_digits=True,
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "sp.model"))
    ids = range(sp.get_piece_size())

    def piece_type(i):  # GGUF's token types are SentencePiece's piece types
        return 2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1

    meta = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [sp.id_to_piece(i) for i in ids],
        "tokenizer.ggml.scores": [sp.get_score(i) for i in ids],
        "tokenizer.ggml.token_type": [piece_type(i) for i in ids],
        "tokenizer.ggml.bos_token_id": sp.bos_id(),
        "tokenizer.ggml.eos_token_id": sp.eos_id(),
        "tokenizer.ggml.unknown_token_id": sp.unk_id(),
        "tokenizer.ggml.add_bos_token": True,
    }
    tok = Tokenizer.from_gguf(meta)
    for text in TRICKY[:-1] + ["Unseen: Zebra ☃ quokka"]:
        want = sp.encode(text)
        assert tok.encode(text, add_special_tokens=False) == want, text
        assert tok.encode(text)[0] == sp.bos_id()  # BOS, as the file asks
        assert tok.decode(want) == sp.decode(want)


# --- chat templates -----------------------------------------------------------------------


def test_chat_template_renders_generation_prompt(default_checkpoint):
    tok = default_checkpoint.tokenizer
    msgs = [{"role": "user", "content": "Hi"}]
    with_prompt = tok.apply_chat_template(msgs, add_generation_prompt=True)
    without = tok.apply_chat_template(msgs, add_generation_prompt=False)
    assert with_prompt == without + "<|im_start|>assistant\n"
    assert "<|im_start|>system\nYou are a helpful AI assistant" in without


def test_chat_template_is_sandboxed():
    evil = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ChatTemplateError):
        evil.render([{"role": "user", "content": "x"}])


def test_chat_template_raise_exception_and_file(tmp_path):
    t = ChatTemplate("{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}ok")
    with pytest.raises(ChatTemplateError, match="user first"):
        t.render([{"role": "assistant", "content": "x"}])
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages | length }}")
    assert (
        ChatTemplate.from_arg(str(path)).render([{"role": "user", "content": "x"}] * 3) == "3"
    )  # --chat-template may be a file


def test_no_chat_template_is_a_clear_error(tmp_path):
    tok = train_tokenizer()
    folder = str(tmp_path / "hf")
    cfg = tiny_config()
    write_hf_folder(folder, cfg, random_tensors(cfg), tok)
    os.remove(os.path.join(folder, "tokenizer_config.json"))
    t = load_checkpoint(folder).tokenizer
    with pytest.raises(ValueError, match="--chat-template"):
        t.apply_chat_template([{"role": "user", "content": "x"}])
    assert np.all(np.array(t.encode("hello")) >= 0)
