"""The pieces of ``scripts/train_embedded_model.py``, which keeps the command line and ``main``.

``data_mix``: what a training step reads (text windows, copy rows, recall items mixed in);
``training_loop``: the learning rate schedule, the loop and its checkpoints; ``evaluation``: the
held-out report (NLL and accuracy by position, recall exact match); ``card``: the run records,
the model card and the written folder.
"""
