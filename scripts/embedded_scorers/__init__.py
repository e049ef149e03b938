"""The pieces of ``scripts/train_embedded_scorers.py``, which keeps the command line and ``main``.

``folders``: saved scorer folders (tensors into a transformed model, a scorer written for a
budget, atomically) and work folders (the run record that refuses a resumed run measured
another way); ``candidates``: the selection measure a run's candidates are chosen by, and choosing
again among a finished run's candidates.
"""
