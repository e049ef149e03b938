"""The transformers releases the library runs on, checked when it is imported.

The bounded cache plugs into transformers' ``Cache`` classes and the Qwen3 forward, whose
signatures change between releases (``Cache`` gained abstract methods; the cache keyword was
renamed from ``past_key_values`` to ``cache``). The range below is the one ``pyproject.toml``
declares and CI tests at both ends; a release outside it is refused by name at import, before
it can fail later or, worse, compute something else.
"""

from __future__ import annotations

import transformers
from packaging.version import Version

# Lowest release tested (CI runs the model tests on it) and the first one not allowed.
TRANSFORMERS_LOWEST = "5.16.1"
TRANSFORMERS_BELOW = "6"


def require_supported_transformers(version: str) -> None:
    """Raise ``ImportError`` unless transformers ``version`` is in the supported range."""
    if not Version(TRANSFORMERS_LOWEST) <= Version(version) < Version(TRANSFORMERS_BELOW):
        raise ImportError(
            f"kvpop_compile supports transformers>={TRANSFORMERS_LOWEST},<{TRANSFORMERS_BELOW}; "
            f"transformers {version} is installed: pip install "
            f"'transformers>={TRANSFORMERS_LOWEST},<{TRANSFORMERS_BELOW}'"
        )


require_supported_transformers(transformers.__version__)
