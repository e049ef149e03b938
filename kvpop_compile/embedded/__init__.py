"""The embedded model: a small byte-level Qwen3 trained on the Python standard library.

``load_embedded_model()`` returns it; :mod:`.corpus` lists its training and held-out files and
turns text into its byte tokens. ``scripts/train_embedded_model.py`` is the recipe; the model
card (``qwen3-stdlib/MODEL_CARD.md``) records the run that produced the shipped weights.
"""

from .corpus import decode, encode, is_held_out, list_files, read_held_out, split_files
from .model import EMBEDDED_MODEL, load_embedded_model

__all__ = [
    "EMBEDDED_MODEL",
    "decode",
    "encode",
    "is_held_out",
    "list_files",
    "load_embedded_model",
    "read_held_out",
    "split_files",
]
