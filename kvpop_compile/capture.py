"""Capture one attention module as an aten-level FX graph with symbolic batch and length.

``torch.export`` traces the module with dynamic batch and sequence dims. The exported program's
runtime checks (input guards, tensor metadata asserts, pytree in/out specs) pin the example's
dtype and forbid length 1; the passes replace the only part that cared about the length (the
attention itself), so the checks are removed and the graph runs for any length, decode included.
Parameters stay the original module's (shared, not copied).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.export import Dim
from torch.fx import GraphModule
from torch.fx.graph import CodeGen

_RUNTIME_CHECKS = {
    torch.ops.aten._assert_tensor_metadata.default,
    torch.ops.aten._assert_scalar.default,
    torch.ops.aten.sym_constrain_range_for_size.default,
    torch.ops.aten.sym_constrain_range.default,
}


class _AttentionCall(nn.Module):
    """Calls a Qwen3 attention with explicit rotary tables and no mask (causality is the
    bounded attention's job)."""

    def __init__(self, attention: nn.Module):
        super().__init__()
        self.attention = attention

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.attention(hidden, (cos, sin), None)[0]


def capture_attention(attention: nn.Module, *, hidden_size: int, head_dim: int) -> GraphModule:
    """Trace ``attention`` into a GraphModule ``(hidden (B, N, hidden), cos, sin (B, N, head_dim))
    -> (out (B, N, hidden),)``."""
    parameter = next(attention.parameters())
    dtype, device = parameter.dtype, parameter.device
    # Length >= 2 so export keeps it symbolic (sizes 0 and 1 are specialised).
    hidden = torch.zeros(2, 8, hidden_size, dtype=dtype, device=device)
    # Two distinct tensors: export would treat one tensor passed twice as one input.
    cos = torch.ones(2, 8, head_dim, dtype=dtype, device=device)
    sin = torch.zeros(2, 8, head_dim, dtype=dtype, device=device)
    dims = {0: Dim.DYNAMIC, 1: Dim.DYNAMIC}
    with torch.no_grad():
        program = torch.export.export(
            _AttentionCall(attention),
            (hidden, cos, sin),
            dynamic_shapes={"hidden": dims, "cos": dims, "sin": dims},
        )
    module = program.module()
    graph = module.graph
    for node in list(graph.nodes):
        is_guard = node.op == "call_module" and node.target == "_guards_fn"
        if is_guard or (node.op == "call_function" and node.target in _RUNTIME_CHECKS):
            graph.erase_node(node)
    graph._codegen = CodeGen()  # plain positional inputs and outputs, no pytree specs
    # Unpickling a GraphModule re-traces its code with its graph's tracer class; export's needs
    # constructor arguments, FX's plain tracer does not.
    graph._tracer_cls, graph._tracer_extras = None, {}
    graph.lint()
    # A fresh GraphModule drops the exported module's input-spec hook; it references (does not
    # copy) the attention's parameters.
    captured = GraphModule(module, graph, class_name="CapturedAttention")
    # Read parameters through the attention's own submodules at call time rather than through
    # the stand-ins GraphModule made: whatever swaps a submodule's parameters (FSDP2 unsharding
    # them for a forward, say) is then seen by the graph.
    captured.attention = attention
    captured.kvpop_layer_idx = getattr(attention, "layer_idx", 0)
    return captured
