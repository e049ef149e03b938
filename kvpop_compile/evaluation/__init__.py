"""What ``kvpop-compile eval``, ``bench`` and ``demo`` run: one wing per command, and the
modules the wings share.

- :mod:`.quality` (``eval``): full attention and every policy at 75% and 88% compression over
  held-out standard-library sequences or a user's own text, ``quality.json`` / ``quality.md``
  and PNG plots; a user's own questions (``eval --data records.jsonl``) as exact-match answers.
- :mod:`.recall` (``eval --recall``): exact-match answers to long-range recall items, by
  family group, task and length, with kvpress's presses beside them.
- :mod:`.bench` (``bench``): long-context prefill and decode speed and memory against
  transformers' caches.
- :mod:`.demo` (``demo``): one held-out recall question, three caches, and the picture of what
  each bounded cache holds.

Shared: :mod:`.data` (held-out and validation sequences), :mod:`.own_data` (a user's checkpoint,
tokenizer, text and questions), :mod:`.methods` (full attention and every policy at each
budget), :mod:`.protocols` (the ways of running a model over a sequence), :mod:`.statistics`
(pooled figures with bootstrap intervals) and :mod:`.plotting` (matplotlib for the PNGs).

This front file keeps the quality benchmark's names: :func:`evaluate` runs it over held-out
sequences and :func:`evaluate_sequences` over any sequences, both writing their files with
:func:`write_report`.
"""

from .data import PROMPT_LENGTH, SEQUENCE_LENGTH, Sequence, held_out_sequences
from .methods import BUDGETS, POLICIES, capacities, methods
from .quality.long_range import long_range_targets
from .quality.measure import PROTOCOLS, EvalSettings, run_eval
from .quality.run import evaluate, evaluate_sequences, write_report

__all__ = [
    "BUDGETS",
    "POLICIES",
    "PROMPT_LENGTH",
    "PROTOCOLS",
    "SEQUENCE_LENGTH",
    "EvalSettings",
    "Sequence",
    "capacities",
    "evaluate",
    "evaluate_sequences",
    "held_out_sequences",
    "long_range_targets",
    "methods",
    "run_eval",
    "write_report",
]
