"""FX graph passes, one per file, each ``(gm: GraphModule, config) -> GraphModule``: exactly the
passes of the inference rewrite, whose order :data:`PASSES` (:mod:`.pipeline`) gives, with the
matching and clean-up helpers they share in :mod:`.pass_utils`. The training passes are in
:mod:`kvpop_compile.training.passes`.
"""

from .insert_scorer import insert_scorer
from .pass_utils import NoAttentionFoundError
from .pipeline import PASSES, run_passes
from .remove_dead_code import remove_dead_code
from .replace_attention import replace_attention

__all__ = [
    "PASSES",
    "NoAttentionFoundError",
    "insert_scorer",
    "remove_dead_code",
    "replace_attention",
    "run_passes",
]
