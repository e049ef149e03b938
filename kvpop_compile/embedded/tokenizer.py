"""A Hugging Face tokenizer whose ids are the UTF-8 bytes, for serving byte-level models.

The embedded model's tokens are bytes (ids 0..255) and it ships no tokenizer files, which is
all ``kvpop_compile`` itself needs. A server that takes text (vLLM's OpenAI-compatible one)
needs a tokenizer: :func:`write_byte_tokenizer` writes one where token ``b`` is byte ``b``, so
text round-trips through it exactly as :func:`~.corpus.encode` / :func:`~.corpus.decode` do.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..atomic import atomic_write

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


def _byte_symbols() -> list[str]:
    """The printable character byte-level tokenizers write for each byte 0..255 (GPT-2's table:
    printable Latin-1 bytes stand for themselves, the rest are shifted past 255)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    symbols, shift = {}, 0
    for b in range(256):
        if b in printable:
            symbols[b] = chr(b)
        else:
            symbols[b] = chr(256 + shift)
            shift += 1
    return [symbols[b] for b in range(256)]


def byte_tokenizer() -> dict:
    """The ``tokenizer.json`` contents: a BPE model with no merges over the 256 byte symbols,
    byte-level pre-tokenizer and decoder, no special tokens."""
    vocab = {symbol: b for b, symbol in enumerate(_byte_symbols())}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": False}  # fmt: skip
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix":
                  None, "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": []},
    }  # fmt: skip


def write_byte_tokenizer(folder: str | os.PathLike) -> Path:
    """Write the byte tokenizer's files into ``folder`` (created if missing); returns it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 30,
              "clean_up_tokenization_spaces": False}  # fmt: skip
    for name, content in ((TOKENIZER_FILE, byte_tokenizer()), (TOKENIZER_CONFIG_FILE, config)):
        text = json.dumps(content, ensure_ascii=False)
        atomic_write(folder / name, lambda path, text=text: Path(path).write_text(text, "utf-8"))
    return folder
