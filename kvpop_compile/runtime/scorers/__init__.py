"""Floor 4 of the runtime: the scorers, one family per file behind the one :class:`Scorer`
interface (:mod:`.base`), built from a config by :func:`build_scorer` (design.md §3).

* :mod:`.mlp`: ``mlp``, learned and stateless; :mod:`.memory`: ``memory``, learned, delayed and
  stateful (the default); both built from :mod:`.layers`.
* :mod:`.heuristics`: ``window``, ``knorm``, ``random``.
* :mod:`.attention_fed`: ``h2o``, ``tova``, scored from the attention the cache receives.
"""

from .attention_fed import AttentionFedScorer, H2OScorer, TOVAScorer
from .base import Scorer
from .heuristics import KNormScorer, RandomScorer, WindowScorer
from .layers import PerHeadMLP
from .memory import MemoryScorer
from .mlp import MLPScorer
from .registry import build_scorer

__all__ = [
    "AttentionFedScorer",
    "H2OScorer",
    "KNormScorer",
    "MLPScorer",
    "MemoryScorer",
    "PerHeadMLP",
    "RandomScorer",
    "Scorer",
    "TOVAScorer",
    "WindowScorer",
    "build_scorer",
]
