"""The quality benchmark (``kvpop-compile eval``): bounded caches against full attention.

:func:`evaluate` runs full attention and every policy at 75% and 88% compression over held-out
standard-library sequences, and writes ``quality.json`` (per-sequence sums), ``quality.md``
(tables with 95% intervals, targets) and PNG plots; :func:`evaluate_sequences` does the same
on any sequences, such as a user's own text (:mod:`.own_data`). See :mod:`.quality` for the run
and its files, :mod:`.benchmark` for what is measured and :mod:`.report` for how it is
summarised.
"""

from .benchmark import PROTOCOLS, EvalSettings, run_eval
from .data import PROMPT_LENGTH, SEQUENCE_LENGTH, Sequence, held_out_sequences
from .long_range import long_range_targets
from .methods import BUDGETS, POLICIES, capacities, methods
from .quality import evaluate, evaluate_sequences, write_report

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
