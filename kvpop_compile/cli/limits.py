"""Limits the command line checks before a run allocates or loops: the memory a ``bench`` or
``export`` batch needs against the memory the machine has, the positions of the model, and the
held-out code the ``demo`` items are cut from. Each refusal is a ``ValueError`` naming the value
given and what is allowed."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

ID_BYTES = torch.empty((), dtype=torch.int64).element_size()  # a prompt's token ids are int64


def available_memory(device: str) -> int:
    """Bytes that can still be allocated on ``device``: a CUDA device's free memory, or for the
    CPU the kernel's estimate of what a new allocation can get without swapping
    (``MemAvailable`` in ``/proc/meminfo``; the free physical pages where there is none)."""
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return free
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def largest(fits: Callable[[int], bool], high: int) -> int:
    """The largest ``n`` in ``[0, high]`` with ``fits(n)`` (``fits`` true up to some ``n`` and
    false after it; ``fits(0)`` is taken as true)."""
    low = 0
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """Bytes of one token's keys and values in ``dtype`` over every layer of a model of
    ``config`` (``num_hidden_layers``, ``num_key_value_heads`` and ``head_dim``, or
    ``hidden_size // num_attention_heads`` where it has no ``head_dim``)."""
    head_dim = getattr(config, "head_dim", None) or (
        config.hidden_size // config.num_attention_heads
    )
    element = torch.empty((), dtype=dtype).element_size()
    return config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * element


def _bench_shape(args: argparse.Namespace):
    """The layer shapes ``bench`` will run: the ``--model`` checkpoint's config (None for a
    model that is not a Qwen3, which the benchmark refuses by itself), or the ``--shape`` cut
    to ``--layers``."""
    if args.model is not None:
        from transformers import AutoConfig

        from ..transform import SUPPORTED_MODEL_TYPES

        config = AutoConfig.from_pretrained(args.model)
        return config if config.model_type in SUPPORTED_MODEL_TYPES else None
    from ..evaluation.bench import MODELS

    size = MODELS[args.shape]
    return argparse.Namespace(
        num_hidden_layers=size.layers if args.layers is None else args.layers,
        num_key_value_heads=size.num_key_value_heads, head_dim=size.head_dim,
    )  # fmt: skip


def check_bench_memory(args: argparse.Namespace, settings, device: str) -> None:
    """Refuse a ``bench`` whose prompts and smallest cache do not fit in ``device``'s memory.

    The random prompts (``batch`` rows of the longest context, int64) are made before any
    method runs, so they must fit; of the methods' caches at least the smallest must fit
    beside them, or no row could run (a method whose larger cache does not fit fails in its
    own row, which is what the benchmark shows). transformers' caches hold every token: the
    context and the ``warmup + decode_tokens`` steps; KVpop's holds ``capacity`` tokens of keys
    and values (and a little scorer state, not counted here: the bound is a lower one).
    """
    from ..evaluation.bench import DTYPES, TRANSFORMERS_METHODS, context_label

    shape = _bench_shape(args)
    if shape is None:
        return
    dtype = DTYPES[args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")]
    per_token = kv_bytes_per_token(shape, dtype)
    steps = settings.warmup + settings.decode_tokens
    transformers = set(settings.methods) & set(TRANSFORMERS_METHODS)
    kvpop = set(settings.methods) - set(TRANSFORMERS_METHODS)

    def cached_tokens(n: int) -> int:
        held = [n + steps] if transformers else []
        return min([*held, *([settings.kvpop_config.max_capacity] if kvpop else [])])

    def needed(n: int, batch: int) -> int:
        return batch * (ID_BYTES * n + per_token * cached_tokens(n))

    longest, batch = max(settings.contexts), settings.batch
    available = available_memory(device)
    if needed(longest, batch) <= available:
        return
    what = (
        f"a sequence's int64 prompt, {ID_BYTES} bytes a token, and the keys and values of the "
        f"smallest cache of the methods, {cached_tokens(longest):,} tokens of {per_token:,} bytes"
    )
    if needed(longest, 1) > available:
        fit = largest(lambda n: needed(n, 1) <= available, longest)
        allowed = f"contexts up to {fit:,} tokens fit" if fit else "no context fits"
        raise ValueError(
            f"--contexts {context_label(longest)}: a prompt of {longest:,} tokens needs at least "
            f"{needed(longest, 1):,} bytes on {device} even with --batch 1 ({what}), more than "
            f"the {available:,} bytes available there; {allowed}"
        )
    raise ValueError(
        f"--batch {batch}: {batch:,} sequences of {longest:,} tokens need at least "
        f"{needed(longest, batch):,} bytes on {device} ({what}), more than the {available:,} "
        f"bytes available there; at most {available // needed(longest, 1):,} sequences of "
        f"{longest:,} tokens fit"
    )


def bounded_cache_bytes(model: nn.Module) -> int:
    """Bytes of the KVpop caches of one sequence on the transformed ``model``: every layer's
    bounded state (keys, values, positions, priorities, window keys, scorer state), sized on
    the meta device, so nothing is allocated."""
    from ..runtime.cache import BoundedCacheState

    total = 0
    for layer in model.model.layers:
        attention = layer.self_attn
        state = BoundedCacheState.empty(
            attention.kvpop_config, attention.scorer, batch=1, head_dim=attention.head_dim,
            dtype=attention.graph_dtype, device="meta",
        )  # fmt: skip
        total += state.nbytes
    return total


def check_prefill_length(prefill_length: int | None, model_folder: str) -> None:
    """Refuse ``export --prefill-length`` beyond the positions of the model in
    ``model_folder`` (its config's ``max_position_embeddings``), before its weights load."""
    if prefill_length is None:
        return
    from transformers import AutoConfig

    positions = AutoConfig.from_pretrained(model_folder).max_position_embeddings
    if prefill_length > positions:
        raise ValueError(
            f"--prefill-length {prefill_length}: the model has {positions:,} positions "
            f"(max_position_embeddings in {Path(model_folder) / 'config.json'}); give "
            f"--prefill-length 2 to {positions}"
        )


def check_export_memory(model: nn.Module, batch: int, prefill_length: int | None) -> None:
    """Refuse ``export --batch`` when the caches of ``batch`` sequences and their int64 prompt
    ids (the 2-token warm-up and the ``prefill_length`` example prompt) exceed the memory of
    the model's device: the export allocates them all before it traces."""
    device = str(next(model.parameters()).device)
    per_sequence = bounded_cache_bytes(model) + ID_BYTES * (2 + (prefill_length or 0))
    available = available_memory(device)
    if batch * per_sequence > available:
        raise ValueError(
            f"--batch {batch}: {batch:,} sequences need at least {batch * per_sequence:,} bytes "
            f"on {device} (caches and prompt ids, {per_sequence:,} bytes a sequence), more than "
            f"the {available:,} bytes available there; at most "
            f"{available // per_sequence:,} sequences fit"
        )


def check_demo_items(items: int, context: int) -> None:
    """Refuse ``demo --items`` beyond what the held-out code holds: every task's items are cut
    from the same held-out files, so ``items`` per task at ``context`` bytes is as much code as
    they hold when ``items * tasks * context`` reaches their size; more would ask about the
    same code again. A context the demo does not ask at is left for it to refuse."""
    from ..embedded.recall import CONTEXT_LENGTHS, TASKS, split_text

    if context not in CONTEXT_LENGTHS:
        return
    size = len(split_text("held_out"))
    limit = size // (len(TASKS) * context)
    if items > limit:
        raise ValueError(
            f"--items {items}: the held-out code is {size:,} bytes, as much as {limit} items per "
            f"task of {context} bytes for the {len(TASKS)} tasks hold; give --items 1 to {limit}"
        )
