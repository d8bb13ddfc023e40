"""`rawpage.tokenizer`, the import path the tokenizer had before it moved to `rawpage.text`.

Kept because code outside the project imports it (the harness that runs vLLM's own server
tests against `rawpage serve` reads the default model's tokenizer from here)."""

from rawpage.text.tokenizer import Tokenizer

__all__ = ["Tokenizer"]
