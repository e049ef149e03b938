"""Shared settings for the training tests: a small budget, real text, a short run."""

import inspect
import json
import logging

from tiny_models import tiny_qwen3

import kvpop_compile as kc
from kvpop_compile.training import train_scorer

CONFIG = kc.KVpopConfig(sinks=2, window=8, topk=16, scorer="memory")
TEXTS = [inspect.getsource(module) for module in (json, inspect, logging)]


def run(tmp_path, steps, model=None, select=None, **overrides):
    """``train_scorer`` on a fresh tiny Qwen3 (or ``model``) for ``steps`` steps, with the
    ``select`` measure if given; ``overrides`` are TrainSettings fields."""
    fields = dict(steps=steps, seq_len=96, batch_size=2, eval_every=5, checkpoint_every=3, lr=3e-3)
    settings = kc.TrainSettings(**{**fields, **overrides})
    model = tiny_qwen3() if model is None else model
    return train_scorer(model, TEXTS, CONFIG, settings, output_dir=tmp_path, progress=False,
                        select=select)  # fmt: skip
