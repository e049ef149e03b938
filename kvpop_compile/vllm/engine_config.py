"""The hook vLLM calls on a KVpop architecture's engine config before it starts."""

from __future__ import annotations

from vllm.model_executor.models.config import VerifyAndUpdateConfig

from .settings import check_engine


class BoundedCacheConfig(VerifyAndUpdateConfig):
    """Checks the engine settings (:func:`~.settings.check_engine`) and sets one state page
    per request and layer."""

    @staticmethod
    def verify_and_update_config(vllm_config) -> None:
        check_engine(vllm_config)
