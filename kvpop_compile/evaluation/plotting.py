"""matplotlib for the reports' PNG plots, imported only when a plot is drawn."""

from __future__ import annotations


def pyplot():
    """matplotlib.pyplot drawing to files only (the Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display is needed or wanted
    import matplotlib.pyplot as plt

    return plt
