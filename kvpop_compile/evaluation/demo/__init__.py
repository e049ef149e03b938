"""``kvpop-compile demo``: a held-out long-range recall question that eviction decides.

- :mod:`.run`: :func:`run_demo`, three caches on the same items and one example side by side;
- :mod:`.plot`: the PNG of which positions each bounded cache holds when it answers.
"""

from .run import run_demo

__all__ = ["run_demo"]
