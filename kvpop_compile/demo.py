"""``kvpop-compile demo``: the embedded Qwen3 continuing held-out code, full cache against KVpop.

The model (shipped with the package, or any local Qwen3 with ``--model``) is prompted with the
start of a held-out standard-library file and generates greedily twice: with transformers' full
cache and with KVpop at 88% compression (the trained ``memory`` scorer shipped for the embedded
model, or ``--scorer``/``--policy``). The report gives both caches' sizes as the context grows,
how much of the KVpop continuation equals the full-cache one, and tokens per second; a PNG
shows, per layer, which positions of the text the KVpop cache holds at the end.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from .config import KVpopConfig, require_int
from .embedded import EMBEDDED_MODEL, decode, load_embedded_model
from .evaluation.data import held_out_sequences
from .evaluation.methods import BUDGETS, budget_config, scorer_folder
from .evaluation.protocols import Continuation, first_difference, greedy_continuation
from .scorer_io import load_scorer, saved_config
from .transform import transform

DEFAULT_CAPACITY = BUDGETS["88%"]
SIZE_CHECKPOINTS = 4  # cache sizes are reported at this many points of the generation


@dataclass
class Setup:
    """What the demo runs: the model, its prompt, and the KVpop config and scorer to use."""

    model: nn.Module
    prompt: torch.Tensor  # (1, P) token ids
    source: str  # where the prompt comes from
    config: KVpopConfig
    scorer: Path | None  # trained scorer folder, None for a baseline policy
    text: Callable[[torch.Tensor], str]  # ids (N,) -> text, for printing and the PNG


def _load_tokenizer(folder: Path):
    """The checkpoint's tokenizer if it has one, else None (a byte-level model)."""
    if not any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def prepare(
    *,
    model_path: str | Path | None = None,
    scorer: str | Path | None = None,
    policy: str | None = None,
    capacity: int = DEFAULT_CAPACITY,
    prompt_tokens: int = 1024,
    tokens: int = 1024,
) -> Setup:
    """Load the model and choose the policy: ``scorer`` (a trained scorer folder) if given,
    else ``policy`` at ``capacity`` (4 sinks, window 64), else the shipped ``memory`` scorer
    (embedded model only)."""
    if scorer is not None and policy is not None:
        raise ValueError("give --scorer (a trained scorer) or --policy (a baseline), not both")
    folder = Path(model_path) if model_path is not None else EMBEDDED_MODEL
    model = load_embedded_model(path=folder)
    limit = model.config.max_position_embeddings
    if prompt_tokens + tokens > limit:
        raise ValueError(
            f"prompt_tokens + tokens = {prompt_tokens + tokens} exceeds the model's context of "
            f"{limit} positions"
        )
    tokenizer = _load_tokenizer(folder)
    if tokenizer is None and model.config.vocab_size != 256:
        raise ValueError(
            f"--model {folder}: no tokenizer files and vocab_size {model.config.vocab_size}; "
            "the demo needs the checkpoint's tokenizer, or a byte-level model (vocab_size 256)"
        )
    sequence = held_out_sequences(1, length=prompt_tokens * 4)[0]  # bytes to spare for BPE
    if tokenizer is None:
        ids, text = sequence.ids[:prompt_tokens], decode
    else:
        encoded = tokenizer(decode(sequence.ids))["input_ids"]
        ids, text = torch.tensor(encoded[:prompt_tokens]), tokenizer.decode
    if ids.numel() < prompt_tokens:
        raise ValueError(f"the held-out prompt has only {ids.numel()} tokens")
    if scorer is not None:
        config, scorer_path = saved_config(scorer), Path(scorer)
    elif policy is not None:
        config, scorer_path = budget_config(policy, capacity), None
        if config.scorer.learned:
            raise ValueError(
                f"--policy {policy} is learned: pass its trained scorer with --scorer PATH"
            )
    elif model_path is None:
        config = budget_config("memory", capacity)
        scorer_path = scorer_folder("memory", capacity)
        if not scorer_path.is_dir():
            shipped = sorted(p.name for p in scorer_path.parent.glob("memory-*"))
            raise FileNotFoundError(
                f"no shipped memory scorer for capacity {capacity} at {scorer_path} (shipped: "
                f"{', '.join(shipped) or 'none'}); use --policy for a baseline at this capacity"
            )
    else:
        raise ValueError(
            "the shipped scorers were trained for the embedded model; with --model pass "
            "--scorer PATH (trained with `kvpop-compile train`) or --policy window|h2o|tova|"
            "knorm|random"
        )
    source = sequence.source.split("@")[0]
    return Setup(model, ids[None], source, config, scorer_path, text)


@dataclass
class DemoResult:
    setup: Setup
    full: Continuation
    kvpop: Continuation
    image: Path | None

    @property
    def agreement(self) -> float:
        """Share of generated positions where KVpop's token equals the full cache's."""
        return float((self.kvpop.tokens == self.full.tokens).float().mean())

    @property
    def first_difference(self) -> int:
        return int(first_difference(self.kvpop.tokens, self.full.tokens)[0])

    def report(self) -> list[str]:
        s, c = self.setup, self.setup.config
        generated = self.full.tokens.shape[1]
        policy = f"trained {c.scorer.value} scorer" if s.scorer else f"{c.scorer.value} policy"
        lines = [
            f"Prompt: the first {s.prompt.shape[1]} tokens of {s.source} (held out: never "
            f"trained on); {generated} tokens generated greedily.",
            f"KVpop: {c.sinks} sinks + {c.window} window + {c.topk} pool = {c.capacity} tokens "
            f"per layer and KV head, {policy}.",
            "",
            "KV cache bytes with N tokens in context:",
        ]
        for n, full_bytes in self.full.cache_bytes.items():
            ratio = self.kvpop.cache_bytes[n] / full_bytes
            lines.append(
                f"  N={n:>6}: full {full_bytes:>12,d} B   KVpop {self.kvpop.cache_bytes[n]:>12,d} B"
                f"  ({ratio:.0%})"
            )
        lines += [
            "",
            f"KVpop continuation: {self.agreement:.1%} of tokens equal to the full-cache one; "
            f"identical for the first {self.first_difference} tokens.",
            f"tokens/s (eager, batch 1): full cache {self.full.tokens_per_second:.0f}, "
            f"KVpop {self.kvpop.tokens_per_second:.0f}",
            "",
            "Full cache continues:  " + _excerpt(s.text(self.full.tokens[0])),
            "KVpop continues:       " + _excerpt(s.text(self.kvpop.tokens[0])),
        ]
        if self.image is not None:
            lines += ["", f"What the KVpop cache holds at the end, per layer: {self.image}"]
        return lines


def _excerpt(text: str, limit: int = 160) -> str:
    return repr(text[:limit])


def run_demo(
    *,
    tokens: int = 1024,
    prompt_tokens: int = 1024,
    model_path: str | Path | None = None,
    scorer: str | Path | None = None,
    policy: str | None = None,
    capacity: int = DEFAULT_CAPACITY,
    image: str | Path | None = "kvpop_demo.png",
    progress: bool = True,
) -> DemoResult:
    """Generate ``tokens`` tokens with the full cache and with KVpop; draw ``image`` if given."""
    require_int("tokens", tokens, 2)
    require_int("prompt_tokens", prompt_tokens, 1)
    setup = prepare(
        model_path=model_path, scorer=scorer, policy=policy, capacity=capacity,
        prompt_tokens=prompt_tokens, tokens=tokens,
    )  # fmt: skip
    total = prompt_tokens + tokens
    kvpop_model = transform(copy.deepcopy(setup.model), setup.config)
    if setup.scorer is not None:
        load_scorer(kvpop_model, setup.scorer)
    step = max(1, tokens // SIZE_CHECKPOINTS)
    # The last token is generated without a forward after it: the last size is at total - 1.
    record_at = {prompt_tokens + k for k in range(step, tokens, step)} | {total - 1}
    runs = {}
    for name, model in (("full cache", setup.model), ("KVpop", kvpop_model)):
        with tqdm(total=tokens, desc=name, unit="tok", disable=not progress) as bar:
            runs[name] = greedy_continuation(
                model, setup.prompt, tokens, record_at=record_at, on_step=bar.update
            )
    result = DemoResult(setup, runs["full cache"], runs["KVpop"], None)
    if image is not None:
        from .demo_plot import plot_kept_positions

        result.image = plot_kept_positions(result, Path(image))
    return result
