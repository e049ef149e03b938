"""The training passes, each ``(gm: GraphModule, config) -> GraphModule`` like the inference
passes of :mod:`kvpop_compile.passes`: ``insert_future_attention_target`` (scorer training's
teacher) and ``replace_attention_for_distillation`` (the distillation student), each followed
by ``remove_dead_code``, composed in :mod:`kvpop_compile.training.objectives`."""

from .insert_future_attention_target import insert_future_attention_target
from .replace_attention_for_distillation import replace_attention_for_distillation

__all__ = ["insert_future_attention_target", "replace_attention_for_distillation"]
