"""The bounded attention of one layer as a vLLM state layer, and the op vLLM's graphs call.

:class:`KVpopStateLayer` is what vLLM calls a Mamba-like layer: it declares a fixed-size state
page per request (:mod:`.pages`), and vLLM allocates a pool of them, admits requests by their
count, and gives each step the pages its requests own (``state_indices``). A step's tokens come
decodes first, then prefill chunks (vLLM orders them so for state layers). The decode rows
take one :func:`~kvpop_compile.runtime.decode_step.decode_step` together, on their pages of
the pool in place (its ``rows``, the step's state indices); the prefill chunks, grouped by
length, continue their requests' states with
:func:`~kvpop_compile.runtime.chunk_step.chunk_step`, each starting from an empty page when its
request has no tokens computed yet (a new request, or one vLLM preempted and recomputes).

The step is a registered custom op (``torch.ops.kvpop_vllm.bounded_attention``) that mutates
its output, so vLLM's ``torch.compile`` graphs see one opaque call per layer.
"""

import torch
from vllm.config import get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.utils.torch_utils import direct_register_custom_op
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

from ..config import KVpopConfig
from ..runtime.chunk_step import chunk_step
from ..runtime.decode_step import decode_step
from ..runtime.scorers.base import Scorer
from .pages import bind_pages, gather_rows, page_layout, pool_state, reset_rows_, scatter_rows_


class KVpopStateLayer(MambaBase, torch.nn.Module):
    """One layer's bounded cache inside vLLM.

    ``forward(q, k, raw_k, v, output)``: ``q (T, Hq * D)`` after RoPE, ``k``, ``raw_k``, ``v``
    ``(T, Hkv * D)`` (keys after and before RoPE, values) for the step's ``T`` tokens; writes
    the attention outputs ``(T, Hq * D)`` into ``output``.
    """

    def __init__(
        self,
        config: KVpopConfig,
        scorer: Scorer,
        *,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        dtype: torch.dtype,
        prefix: str,
    ):
        torch.nn.Module.__init__(self)
        self.config, self.scorer = config, scorer
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale, self.dtype, self.prefix = scale, dtype, prefix
        self.layout = page_layout(config, scorer, head_dim, dtype)
        self.pool: dict[str, torch.Tensor] = {}
        self.kv_cache = (torch.tensor([]),)
        context = get_current_vllm_config().compilation_config.static_forward_context
        if prefix in context:
            raise ValueError(f"duplicate vLLM layer name: {prefix}")
        context[prefix] = self

    # What vLLM asks of a state layer.
    @property
    def mamba_type(self) -> MambaAttentionBackendEnum:
        # The plain state-layer metadata: state indices, decode/prefill split, start offsets.
        return MambaAttentionBackendEnum.SHORT_CONV

    def get_state_shape(self) -> tuple[tuple[int, ...], ...]:
        return tuple(f.shape for f in self.layout)

    def get_state_dtype(self) -> tuple[torch.dtype, ...]:
        return tuple(f.dtype for f in self.layout)

    def bind_kv_cache(self, kv_cache: torch.Tensor) -> None:
        self.pool = bind_pages(kv_cache, self.layout)
        self.kv_cache = tuple(self.pool.values())

    def forward(self, q, k, raw_k, v, output) -> None:
        torch.ops.kvpop_vllm.bounded_attention(q, k, raw_k, v, output, self.prefix)

    def step(self, q, k, raw_k, v, output) -> None:
        """The op's body (arguments as :meth:`forward`)."""
        metadata = get_forward_context().attn_metadata
        metadata = metadata.get(self.prefix) if isinstance(metadata, dict) else None
        if metadata is None:  # a profiling or warm-up run: no pages are bound
            output.zero_()
            return
        decodes = metadata.num_decode_tokens
        if metadata.num_decodes:
            index = metadata.state_indices_tensor_d[:, 0].long()
            output[:decodes] = self._run(index, q[:decodes], k[:decodes], raw_k[:decodes],
                                         v[:decodes], decode=True)  # fmt: skip
        if metadata.num_prefills:
            self._prefill(metadata, decodes, q, k, raw_k, v, output)

    def _prefill(self, metadata, decodes: int, q, k, raw_k, v, output) -> None:
        """The step's prefill chunks through their requests' pages: chunks of one length go
        through one chunk step together (a batch of new prompts of one length, or vLLM's
        fixed-size chunks of long ones); chunks of other lengths take a step each, since a
        chunk step runs rows of one length."""
        starts = (metadata.query_start_loc_p + decodes).tolist()
        index = metadata.state_indices_tensor_p.long()
        fresh = ~metadata.has_initial_states_p
        if bool(fresh.any()):
            reset_rows_(self.pool, index[fresh])
        by_length: dict[int, list[int]] = {}
        for row, (start, end) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
            by_length.setdefault(end - start, []).append(row)
        for length, rows in by_length.items():
            # The rows' tokens, request after request: the token-major layout _run reads.
            tokens = torch.cat([torch.arange(starts[r], starts[r] + length) for r in rows])
            tokens = tokens.to(q.device)
            output[tokens] = self._run(index[rows], q[tokens], k[tokens], raw_k[tokens],
                                       v[tokens], decode=False)  # fmt: skip

    def _run(self, index, q, k, raw_k, v, *, decode: bool) -> torch.Tensor:
        """Rows of pages ``index (B,)`` through one step: one token per row (``decode``, in
        place on the pool's pages) or ``L`` tokens of each of ``B`` requests (on a copy of their
        pages written back). Token-major ``(B * L, H * D)`` in and out."""
        rows = index.shape[0]
        length = q.shape[0] // rows

        def heads(x: torch.Tensor, n: int) -> torch.Tensor:  # (B * L, n * D) -> (B, n, L, D)
            return x.view(rows, length, n, self.head_dim).transpose(1, 2)

        inputs = (heads(q, self.num_heads), heads(k, self.num_kv_heads),
                  heads(raw_k, self.num_kv_heads), heads(v, self.num_kv_heads))  # fmt: skip
        settings = dict(scorer=self.scorer, config=self.config, scale=self.scale)
        if decode:
            out = decode_step(pool_state(self.pool), *inputs, rows=index, **settings)
        else:
            state = gather_rows(self.pool, index)
            out = chunk_step(state, *inputs, **settings)
            scatter_rows_(self.pool, index, state)
        return out.transpose(1, 2).reshape(rows * length, self.num_heads * self.head_dim)


# Plain annotations (no ``from __future__``): the op's schema is read from them.
def _bounded_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    raw_k: torch.Tensor,
    v: torch.Tensor,
    output: torch.Tensor,
    layer_name: str,
) -> None:
    layer = get_forward_context().no_compile_layers[layer_name]
    with torch.no_grad():
        layer.step(q, k, raw_k, v, output)


def _bounded_attention_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    raw_k: torch.Tensor,
    v: torch.Tensor,
    output: torch.Tensor,
    layer_name: str,
) -> None:
    return None


_LIBRARY = torch.library.Library("kvpop_vllm", "FRAGMENT")  # noqa: TOR901 (lives with the op)
direct_register_custom_op(
    op_name="bounded_attention",
    op_func=_bounded_attention,
    mutates_args=["output"],
    fake_impl=_bounded_attention_fake,
    target_lib=_LIBRARY,
)
