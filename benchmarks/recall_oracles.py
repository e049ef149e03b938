"""Which target a policy should imitate: oracle policies on the embedded model's recall items.

    python benchmarks/recall_oracles.py                    # 8 held-out items per task, 2048 bytes
    python benchmarks/recall_oracles.py --items 2 --tasks lookup --out /tmp/oracles.md

Each oracle fills the pool (88% compression: 4 sinks + 64 window + 188 pool) by a score known
only in hindsight, computed per item from the full model's attention maps, so what it answers
is the best a scorer trained against that score can hope for:

- ``mean target``: the training target of the design, ``log max_g mean_{d >= t + W} p_{d->t}``;
- ``max target``: the same with the max over later queries (``TrainSettings(target="max")``);
- ``max target + lam t``: the max target with the policy's recency term (``RECENCY``);
- ``definition``: the lines the answer follows from (and the 16 bytes before each), in every head.

Next to them: full attention and the ``window`` heuristic at the same budget. Exact-match
answers under the prefill protocol; writes a markdown table to ``--out``.

    python benchmarks/recall_oracles.py --text             # 8 held-out text sequences

``--text`` asks the same of ordinary text instead: the teacher-forced top-1 accuracy of each
oracle on held-out standard-library sequences of 2048 bytes, as a percentage of full
attention's, at 75% and 88% compression. Writes ``text_oracles.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository's packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks.harness import write_report  # noqa: E402
from kvpop_compile.embedded import load_embedded_model  # noqa: E402
from kvpop_compile.embedded.corpus import encode  # noqa: E402
from kvpop_compile.embedded.recall import TASKS, RecallItem, recall_items  # noqa: E402
from kvpop_compile.evaluation.data import held_out_sequences  # noqa: E402
from kvpop_compile.evaluation.methods import BUDGETS, WINDOW, Method, build_model  # noqa: E402
from kvpop_compile.evaluation.protocols import teacher_forced  # noqa: E402
from kvpop_compile.evaluation.recall.protocol import RECALL_SEED, greedy_answers  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "recall_oracles.md"
TEXT_RESULTS = RESULTS.with_name("text_oracles.md")
RECENCY = (0.0005, 0.001, 0.002)  # lam of the max target's recency variants (--text)
LEAD = 16  # bytes before each evidence line that the definition oracle keeps too


def future_attention(model, ids: torch.Tensor, aggregate: str) -> list[torch.Tensor]:
    """Per layer, ``(Hkv, N)`` log of the attention each key receives from the queries at least
    ``WINDOW`` after it (mean or max over them, max over the KV head's query heads), from the
    full model's dense attention maps ``(Hq, N, N)``."""
    with torch.no_grad():
        maps = model(ids, output_attentions=True).attentions
    n = ids.shape[1]
    keys = torch.arange(n)
    first = (keys + WINDOW).clamp(max=n - 1)  # the first query that counts for each key
    scores = []
    for attention in maps:
        probs = attention[0]  # (Hq, N queries, N keys)
        later = probs.flip(1)
        later = later.cummax(1).values if aggregate == "max" else later.cumsum(1)
        received = later.flip(1)[:, first, keys]  # over queries d >= t + W
        if aggregate == "mean":
            received = received / (n - keys - WINDOW).clamp(min=1)
        kv_heads = model.config.num_key_value_heads
        received = received.view(kv_heads, -1, n).amax(dim=1)
        scores.append(received.clamp_min(1e-30).log())
    return scores


def definition_scores(item: RecallItem, layers: int, kv_heads: int) -> list[torch.Tensor]:
    """Per layer, ``(Hkv, N)``: 1 on the lines the answer follows from and the bytes just
    before each."""
    score = torch.zeros(kv_heads, len(item.prompt) + len(item.answer))
    for start, end in item.evidence:
        score[:, max(0, start - LEAD) : end] = 1.0
    return [score] * layers


def install(policy_model, per_layer: list[torch.Tensor]) -> None:
    """Make every layer's scorer return ``per_layer[layer][head, position]``: the oracle's
    score of the token leaving the window (a ``window`` model's scorer, whose own score is
    its position, is the only thing replaced)."""
    for layer, scores in zip(policy_model.model.layers, per_layer, strict=True):

        def score_tokens(k, v, position, scores=scores):
            heads = torch.arange(scores.shape[0]).view(1, -1, *([1] * (k.dim() - 3)))
            index = position.clamp(0, scores.shape[1] - 1)
            return scores[heads, index].expand(k.shape[:-1]).float()

        layer.self_attn.scorer.score_tokens = score_tokens


def oracle_rows() -> list[str]:
    """The target oracles' row names: the two targets, then the max with each recency term."""
    return ["mean target", "max target", *(f"max target + {lam} t" for lam in RECENCY)]


def target_oracles(model, ids: torch.Tensor) -> dict[str, list[torch.Tensor]]:
    """Per row of :func:`oracle_rows`, the per-layer ``(Hkv, N)`` scores for ``ids (1, N)``."""
    maximum = future_attention(model, ids, "max")
    positions = torch.arange(ids.shape[1])
    scores = {"mean target": future_attention(model, ids, "mean"), "max target": maximum}
    for lam in RECENCY:
        scores[f"max target + {lam} t"] = [s + lam * positions for s in maximum]
    return scores


def text_oracles(model, sequences: int) -> str:
    """Teacher-forced top-1 retention of the oracles on ``sequences`` held-out text windows, as
    a markdown table (one row per policy, one column per budget)."""
    rows = ["window", *oracle_rows()]
    correct = {(row, budget): 0.0 for row in rows for budget in BUDGETS}
    full = 0.0
    models = {b: (build_model(model, Method("window", b)),
                  build_model(model, Method("window", b))) for b in BUDGETS}  # fmt: skip
    for sequence in held_out_sequences(sequences):
        ids = sequence.ids[None]
        full += teacher_forced(model, ids).correct.sum().item()
        scores = target_oracles(model, ids[:, :-1])
        for budget, (window_model, oracle_model) in models.items():
            for row in rows:
                runner = window_model
                if row in scores:
                    install(oracle_model, scores[row])
                    runner = oracle_model
                correct[row, budget] += teacher_forced(runner, ids).correct.sum().item()
        print(sequence.source, flush=True)
    lines = [
        f"# Oracle policies on held-out text ({sequences} sequences of 2048 bytes)",
        "",
        "Teacher-forced top-1 accuracy as a percentage of full attention's. An oracle fills the "
        "pool by a score known in hindsight (see `benchmarks/recall_oracles.py`); `+ lam t` adds "
        "the policy's recency term to the max target.",
        "",
        "| policy | " + " | ".join(f"{b} ({BUDGETS[b]} kept)" for b in BUDGETS) + " |",
        "|---|" + "---|" * len(BUDGETS),
    ]
    for row in rows:
        cells = " | ".join(f"{100 * correct[row, b] / full:.2f}" for b in BUDGETS)
        lines.append(f"| {row} | {cells} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="model folder (default: the embedded one)")
    parser.add_argument("--items", type=int, default=8, help="held-out items per task")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--text", action="store_true", help="oracles on held-out text instead")
    parser.add_argument("--sequences", type=int, default=8, help="with --text: text windows")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, help="markdown file (default: in results/)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load_embedded_model(path=args.model)
    model.config._attn_implementation = "eager"  # attention maps for the oracles' scores
    if args.text:
        text = text_oracles(model, args.sequences)
        write_report(args.out or TEXT_RESULTS, text)
        return
    budget = "88%"
    window_model = build_model(model, Method("window", budget))
    oracle_model = build_model(model, Method("window", budget))
    layers, kv_heads = model.config.num_hidden_layers, model.config.num_key_value_heads
    rows = ["full attention", "window", *oracle_rows(), "definition"]
    right = {row: {} for row in rows}
    for task in args.tasks.split(","):
        items = recall_items("held_out", task, 2048, args.items, RECALL_SEED)
        for row in rows:
            right[row][task] = 0
        for item in items:
            ids = encode(item.prompt + item.answer)[None, :-1]
            oracles = target_oracles(model, ids)
            oracles["definition"] = definition_scores(item, layers, kv_heads)
            for row in rows:
                if row in oracles:
                    install(oracle_model, oracles[row])
                runner = {"full attention": model, "window": window_model}.get(row, oracle_model)
                answer, _ = greedy_answers(runner, [item], "prefill")
                right[row][task] += bytes(answer[0].tolist()) == item.answer
            print(task, {row: right[row][task] for row in rows}, flush=True)
    tasks = list(right["window"])
    lines = [
        f"# Oracle policies on held-out recall items ({args.items} per task, 2048 bytes, "
        f"{BUDGETS[budget]} tokens kept: {budget} compression)",
        "",
        "Exact answers. An oracle fills the pool by a score known in hindsight (see "
        "`benchmarks/recall_oracles.py`); `+ lam t` adds the policy's recency term to the max "
        "target.",
        "",
        "| policy | " + " | ".join(tasks) + " | all |",
        "|---|" + "---|" * (len(tasks) + 1),
    ]
    for row in rows:
        total = sum(right[row].values())
        cells = " | ".join(f"{right[row][t]}/{args.items}" for t in tasks)
        lines.append(f"| {row} | {cells} | {total}/{args.items * len(tasks)} |")
    write_report(args.out or RESULTS, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
