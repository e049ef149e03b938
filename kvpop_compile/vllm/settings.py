"""What a served model's bounded cache is: read from the checkpoint's config or vLLM's
``hf_overrides``, and the engine settings a bounded cache needs (checked before vLLM starts).

The checkpoint's Hugging Face config carries a ``kvpop`` entry, ``{"config": KVpopConfig
fields, "scorer_path": folder or null}``, and names a KVpop architecture
(:data:`ARCHITECTURES`). :func:`engine_kwargs` writes both as ``hf_overrides`` for
``vllm.LLM`` or the server, so the checkpoint folder itself is left as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config import KVpopConfig
from ..scorer_io import saved_config

ARCHITECTURES = {
    "Qwen3ForCausalLM": "KVpopQwen3ForCausalLM",
    "Qwen3MoeForCausalLM": "KVpopQwen3MoeForCausalLM",
}
"""The model a KVpop architecture serves, by the checkpoint's own architecture."""
MODEL_TYPES = {"KVpopQwen3ForCausalLM": "qwen3", "KVpopQwen3MoeForCausalLM": "qwen3_moe"}
CONFIG_KEY = "kvpop"


@dataclass(frozen=True)
class ServeSettings:
    """A served model's budget and policy, and the trained scorer folder (None: the policy
    needs no weights, or is served untrained)."""

    config: KVpopConfig
    scorer_path: str | None = None

    def __post_init__(self) -> None:
        if self.config.per_layer is not None:
            # vLLM gives every layer's state pages of one size: the largest layer's page in
            # every layer would hold more memory than the budget says.
            raise ValueError(
                f"vLLM serves one budget in every layer; this config keeps "
                f"{list(self.config.capacities)} slots per KV head in its layers (window="
                f"{list(self.config.window)}, topk={list(self.config.topk)}). Serve it at one "
                "budget: serve_settings(folder, capacity=N, window=W), or kvpop-compile serve "
                "--capacity N --window W"
            )

    def to_dict(self) -> dict:
        return {"config": self.config.to_dict(), "scorer_path": self.scorer_path}

    @classmethod
    def from_hf_config(cls, hf_config) -> ServeSettings:
        entry = getattr(hf_config, CONFIG_KEY, None)
        if not isinstance(entry, dict) or not isinstance(entry.get("config"), dict):
            raise ValueError(
                f"the model's config has no {CONFIG_KEY!r} entry {{'config': {{...}}, "
                "'scorer_path': ...}: pass it in hf_overrides (kvpop_compile.vllm."
                "engine_kwargs writes it)"
            )
        try:
            config = KVpopConfig(**entry["config"])
        except (TypeError, ValueError) as error:
            raise ValueError(f"the model's {CONFIG_KEY!r} config is invalid: {error}") from None
        return cls(config, entry.get("scorer_path"))


def serve_settings(
    scorer_path: str | Path | None = None,
    config: KVpopConfig | None = None,
    capacity: int | None = None,
    window: int | None = None,
) -> ServeSettings:
    """The settings of a served model: ``config``, or the one ``scorer_path`` was saved with
    (a trained scorer is served with the window and sizes it was trained for), at ``capacity``
    slots per layer and KV head with a ``window`` of the most recent tokens when either is
    given (the saved value where one is not). A per-layer budget is served only so, at one
    budget, and needs both."""
    if config is None:
        config = saved_config(scorer_path) if scorer_path is not None else KVpopConfig()
    if capacity is not None or window is not None:
        if config.per_layer is not None and (capacity is None or window is None):
            raise ValueError(
                f"the config keeps a per-layer budget ({list(config.capacities)} slots per KV "
                "head); give both capacity and window to serve it at one budget"
            )
        window = config.window if window is None else window
        capacity = config.capacity if capacity is None else capacity
        topk = capacity - config.sinks - window
        if topk < 0:
            raise ValueError(
                f"capacity {capacity} is below sinks + window = {config.sinks + window} of "
                "this policy"
            )
        config = KVpopConfig(**{**config.to_dict(), "window": window, "topk": topk})
    path = None if scorer_path is None else str(Path(scorer_path).resolve())
    return ServeSettings(config, path)


def engine_kwargs(architecture: str, settings: ServeSettings) -> dict:
    """Keyword arguments for ``vllm.LLM`` (or the server's options) that serve a checkpoint of
    ``architecture`` with ``settings``: the KVpop architecture and settings as
    ``hf_overrides``, and prefix caching off (a state after a shared prefix is not kept)."""
    if architecture not in ARCHITECTURES:
        raise ValueError(
            f"kvpop_compile serves {', '.join(ARCHITECTURES)} checkpoints, got {architecture!r}"
        )
    return {
        "hf_overrides": {
            "architectures": [ARCHITECTURES[architecture]],
            CONFIG_KEY: settings.to_dict(),
        },
        "enable_prefix_caching": False,
    }


def check_engine(vllm_config) -> None:
    """Refuse engine settings under which a bounded cache would give wrong tokens, naming the
    setting; and give each request one state page per layer (vLLM's ``none`` state mode)."""
    model_config, cache = vllm_config.model_config, vllm_config.cache_config
    architecture = model_config.architecture
    model_type = getattr(model_config.hf_config, "model_type", None)
    if model_type != MODEL_TYPES.get(architecture):
        raise ValueError(
            f"{architecture} serves {MODEL_TYPES.get(architecture)!r} checkpoints; this one "
            f"is {model_type!r}"
        )
    if cache.enable_prefix_caching:
        raise ValueError(
            "prefix caching cannot be used with a bounded cache: the state after a shared "
            "prefix is not kept, only the request's own; pass enable_prefix_caching=False "
            "(--no-enable-prefix-caching)"
        )
    if vllm_config.speculative_config is not None:
        raise ValueError(
            "speculative decoding cannot be used with a bounded cache: an eviction made for a "
            "draft token is not undone when the draft is rejected; remove speculative_config"
        )
    if vllm_config.parallel_config.tensor_parallel_size != 1:
        raise ValueError(
            "a bounded cache is served with tensor_parallel_size=1 only (its scorers are not "
            f"split across ranks), got {vllm_config.parallel_config.tensor_parallel_size}"
        )
    cache.mamba_cache_mode = "none"
    # One page per request holds its whole state, whatever its length.
    cache.mamba_block_size = model_config.max_model_len
    ServeSettings.from_hf_config(model_config.hf_config)  # a bad entry fails here, early
