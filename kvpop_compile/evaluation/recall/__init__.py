"""``kvpop-compile eval --recall``: exact-match answers to long-range recall items.

- :mod:`.protocol`: the items asked (family groups, tasks, lengths), the two ways of asking
  (``prefill``, ``decode``) and :func:`run_recall`;
- :mod:`.report`: :func:`evaluate_recall` and :func:`write_recall_report` (``recall.json``,
  ``recall.md``: accuracy and retention with bootstrap intervals, the recall targets);
- :mod:`.kvpress`: kvpress's presses from ``kvpress_recall.json``, beside this run's rows;
- :mod:`.kept`: which KV heads still hold an item's planted lines when it is answered.
"""

from .protocol import RECALL_FAMILIES, RECALL_PROTOCOLS, RECALL_SEED, RecallSettings, run_recall
from .report import evaluate_recall, write_recall_report

__all__ = [
    "RECALL_FAMILIES",
    "RECALL_PROTOCOLS",
    "RECALL_SEED",
    "RecallSettings",
    "evaluate_recall",
    "run_recall",
    "write_recall_report",
]
