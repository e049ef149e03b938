"""replace_attention: rewrite every attention of a captured graph into KVpop bounded attention.

Each site (:func:`~.pass_utils.find_attentions`: sdpa or the eager chain, with keys and values
traced back through ``repeat_kv``) becomes a call to a :class:`BoundedAttention` submodule
whose cache state arrives as new graph inputs (one per state tensor), so the state can live
outside the graph.
"""

from __future__ import annotations

import logging
from dataclasses import fields

from torch.fx import GraphModule, Node

from ..config import KVpopConfig
from ..runtime.bounded_attention import BoundedAttention
from ..runtime.cache import BoundedCacheState
from .pass_utils import clean_up, find_attentions

logger = logging.getLogger(__name__)


def _add_state_inputs(gm: GraphModule, prefix: str) -> list[Node]:
    last_input = [n for n in gm.graph.nodes if n.op == "placeholder"][-1]
    inputs = []
    for field in fields(BoundedCacheState):
        with gm.graph.inserting_after(last_input):
            last_input = gm.graph.placeholder(f"{prefix}_{field.name}")
        inputs.append(last_input)
    return inputs


def replace_attention(gm: GraphModule, config: KVpopConfig) -> GraphModule:
    """Replace each attention site with a ``BoundedAttention`` call on explicit cache state.

    The new submodules are ``kvpop_attention_<i>``; the first site's layer index is
    ``gm.kvpop_layer_idx`` (0 if unset), used to seed the layer's scorer.
    """
    matches = find_attentions(gm)
    first_layer = getattr(gm, "kvpop_layer_idx", 0)
    for site, match in enumerate(matches):
        name = f"kvpop_attention_{site}"
        gm.add_submodule(name, BoundedAttention(config, first_layer + site, match.scale))
        state = _add_state_inputs(gm, f"kvpop_state_{site}")
        with gm.graph.inserting_before(match.output):
            bounded = gm.graph.call_module(name, args=(match.query, match.key, match.value, *state))
        bounded.meta = dict(match.output.meta)
        match.output.replace_all_uses_with(bounded)
        # sdpa counts as impure (it may draw dropout noise), so dead-code removal keeps it.
        gm.graph.erase_node(match.output)
    logger.info("replace_attention: rewrote %d attention site(s)", len(matches))
    return clean_up(gm, changed=True)
