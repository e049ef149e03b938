"""kvpress's presses on the embedded model: prompt compression, and long-range recall.

NVIDIA's kvpress pins a transformers older than kvpop_compile needs, so its presses run in a
virtual environment of their own (created on first use) through
:mod:`benchmarks.kvpress_worker`; this driver, in the project's environment, hands it the
benchmark sequences and summarises what it measures into one JSON file that the quality
benchmark reads::

    python benchmarks/kvpress_eval.py [--sequences 64] [--venv .venv-kvpress]
        [--model FOLDER] [--out benchmarks/results/kvpress.json]

With ``--recall`` it asks the recall benchmark's held-out items instead (the same items, built
by the same call and named by the same family groups as ``kvpop-compile eval --recall``), and
the recall report reads the result::

    python benchmarks/kvpress_eval.py --recall [--items 64] [--lengths 1024,2048]
        [--families train,held_out] [--protocols prefill,decode] [--presses snapkv,tova]
        [--budgets 88%] [--out benchmarks/results/kvpress_recall.json]

Items of one group differ in value length and question syntax, so the worker gets each group
in parts of one shape (:func:`same_shape`) and the driver puts the answers back in item order.

Recall runs of other presses or budgets on the same items join into one file, a later file's
press, budget and protocol replacing an earlier one's (:func:`merge_recall_summaries`)::

    python benchmarks/kvpress_eval.py --merge FILE FILE [...] --out FILE
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository's packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # kvpress_merge beside it

import torch  # noqa: E402
from kvpress_merge import merge_files  # noqa: E402

from kvpop_compile.atomic import atomic_write  # noqa: E402
from kvpop_compile.embedded.corpus import encode  # noqa: E402
from kvpop_compile.embedded.model import EMBEDDED_MODEL, load_embedded_model  # noqa: E402
from kvpop_compile.embedded.recall import CONTEXT_LENGTHS, TASKS, RecallItem, recall_items  # noqa: E402
from kvpop_compile.embedded.recall_syntax import FAMILY_SPLITS  # noqa: E402
from kvpop_compile.evaluation.data import (  # noqa: E402
    PROMPT_LENGTH,
    Sequence,
    held_out_sequences,
)
from kvpop_compile.evaluation.methods import BUDGETS, WINDOW  # noqa: E402
from kvpop_compile.evaluation.quality.long_range import long_range_targets  # noqa: E402
from kvpop_compile.evaluation.recall.protocol import (  # noqa: E402
    RECALL_FAMILIES,
    RECALL_PROTOCOLS,
    RECALL_SEED,
    decode_stretch,
    group_key,
)
from kvpop_compile.fingerprints import weights_sha256  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "kvpress_worker.py"
TORCH_PIN = "torch==2.13.0"  # the CPU wheel; kvpress accepts torch >= 2.3.1, < 3
KVPRESS_PIN = "kvpress==0.5.5"
PRESSES = ("none", "snapkv", "expected_attention", "tova", "knorm", "streaming_llm")
CHECKPOINT_FILES = ("config.json", "model.safetensors")

PROTOCOL = (
    f"Prompt compression: the first {PROMPT_LENGTH} tokens of each sequence are prefilled with "
    "the press active (kvpress compresses the cache during prefill, keeping the budget's "
    "tokens per layer and head: 512 for 75%, 256 for 88%); the remaining inputs are then fed "
    f"at their true positions ({PROMPT_LENGTH} onwards) with that cache and no press, and each "
    "following byte is scored (argmax correct; NLL in nats from a float32 log-softmax). "
    "Press 'none' keeps the whole prompt (budget 0%). StreamingLLM and ExpectedAttention keep "
    f"4 sink tokens. Long-range targets: long_range_targets(ids, {WINDOW}) over the whole "
    "sequence, restricted to the scored bytes."
)

DECODE_INTERVAL = 65
"""Forwards between two of kvpress's compressions in the decode protocol. ``DecodingPress``
empties its buffer of recent queries at each compression, and SnapKV scores from a 64-query
window that it requires the buffer to exceed, so 65 is the shortest interval every press here
runs at; one interval for all keeps the presses comparable with one another."""

RECALL_PROTOCOL = (
    "Recall: the held-out items of `kvpop-compile eval --recall` (recall_items('held_out', task, "
    f"length, items, seed {RECALL_SEED})), scored by the exact match of the greedy answer. "
    "Prefill protocol: the prompt but its last token is prefilled with the press active, which "
    "keeps the recall benchmark's tokens per layer and KV head at every length, as its methods "
    "do (BUDGETS: 512 and 256, for 75% and 88% of a 2048-token context; a 1024-byte prompt is "
    "compressed by 50% and 75%); the last prompt token and then the answer are fed one per "
    "forward at their true positions with no press, so every answer token is "
    "chosen from the compressed cache (the prefill's own logits, computed with the whole prompt "
    "in view, are not used). The question is inside the prefilled prompt, so a press that looks "
    "at the latest queries (SnapKV's 64-token window, TOVA) sees it when it compresses. Decode "
    "protocol (lengths with room for a stretch, as in the project's): the prompt up to the "
    "question line is prefilled with the press, then as many greedy tokens as the item is long, "
    "the question and the answer are fed one per forward while kvpress's DecodingPress (inside "
    f"PrefillDecodingPress) compresses the cache back to the budget every {DECODE_INTERVAL} "
    "forwards, the shortest interval at which SnapKV runs: between compressions the cache holds "
    f"up to {DECODE_INTERVAL} tokens more than the budget, where the project's bounded cache "
    "never exceeds it. kvpress warns that some presses do not fit its DecodingPress: SnapKV "
    "rotates its buffered queries to the current position, ExpectedAttention averages RoPE over "
    "positions counted from the buffer's length. Press 'none' (budget 0%) is kvpress's "
    "environment with no press, a check against the project's full attention. StreamingLLM and "
    "ExpectedAttention keep 4 sink tokens."
)


def sequence_figures(ids: torch.Tensor, correct: list, nll: list, prompt_length: int) -> dict:
    """Accuracy, mean NLL and long-range hits of one sequence's scored targets.

    ``ids`` is the whole (N,) sequence; ``correct`` and ``nll`` hold one entry per target
    ``ids[prompt_length + 1:]``. Long-range targets are found over the whole sequence (earlier
    occurrences in the prompt count), then restricted to the scored targets.
    """
    scored = ids.numel() - prompt_length - 1
    if len(correct) != scored or len(nll) != scored:
        raise ValueError(
            f"expected {scored} scored targets, got {len(correct)} correct and {len(nll)} NLL"
        )
    hits = torch.tensor(correct, dtype=torch.bool)
    mask = long_range_targets(ids, WINDOW)[prompt_length + 1 :]
    return {
        "accuracy": hits.float().mean().item(),
        "nll": torch.tensor(nll, dtype=torch.float64).mean().item(),
        "long_range_correct": int(hits[mask].sum()),
        "long_range_count": int(mask.sum()),
    }


def summarise(worker_result: dict, sequences: list[Sequence], prompt_length: int) -> dict:
    """Per press and budget: per-sequence figures and their means, or the press's error.

    ``worker_result`` is what :mod:`benchmarks.kvpress_worker` writes. A failed press is kept
    as ``{"error": message}`` and listed under ``errors`` as ``"press budget: message"``.
    """
    results: dict[str, dict] = {}
    errors = []
    for press, budgets in worker_result["results"].items():
        results[press] = {}
        for budget, outcome in budgets.items():
            if "error" in outcome:
                results[press][budget] = {"error": outcome["error"]}
                errors.append(f"{press} {budget}: {outcome['error']}")
                continue
            if len(outcome["correct"]) != len(sequences):
                raise ValueError(
                    f"{press} {budget}: {len(outcome['correct'])} results for "
                    f"{len(sequences)} sequences"
                )
            rows = [
                {"source": s.source, **sequence_figures(s.ids, c, n, prompt_length)}
                for s, c, n in zip(sequences, outcome["correct"], outcome["nll"], strict=True)
            ]
            long_range = sum(r["long_range_count"] for r in rows)
            results[press][budget] = {
                "accuracy": sum(r["accuracy"] for r in rows) / len(rows),
                "nll": sum(r["nll"] for r in rows) / len(rows),
                "long_range_accuracy": (
                    sum(r["long_range_correct"] for r in rows) / long_range if long_range else None
                ),
                "sequences": rows,
            }
    return {"versions": worker_result["versions"], "results": results, "errors": errors}


def recall_groups(
    tasks=TASKS,
    lengths=CONTEXT_LENGTHS,
    count: int = 64,
    seed: int = RECALL_SEED,
    families=RECALL_FAMILIES,
) -> dict[str, list[RecallItem]]:
    """``{"families/task@length": items}``: the held-out items the recall benchmark asks, by
    the same call, under the same names and in the same order as
    :func:`kvpop_compile.evaluation.recall.run_recall`."""
    return {
        group_key(group, task, length): recall_items(
            "held_out", task, length, count, seed, families=group
        )
        for group in families
        for task in tasks
        for length in lengths
    }


def question_cut(items: list[RecallItem]) -> int:
    """Where the question line starts in each prompt of ``items``: the decode protocol's cut,
    as :func:`kvpop_compile.evaluation.recall.protocol.greedy_answers` finds it; the items must
    share it."""
    cuts = sorted({item.prompt.rindex(b"\n") + 1 for item in items})
    if len(cuts) != 1:
        raise ValueError(f"items of one group must share the question's start, got {cuts}")
    return cuts[0]


def same_shape(items: list[RecallItem]) -> list[list[int]]:
    """The indices of ``items`` in runs of one shape (prompt length, answer length, question
    start), each in item order, the runs in order of their first item: what the worker batches
    together. Items of one syntax family and alphabet mostly share one; a group of many
    families and value lengths has many."""
    shapes: dict[tuple[int, int, int], list[int]] = {}
    for index, item in enumerate(items):
        shape = (len(item.prompt), len(item.answer), item.prompt.rindex(b"\n") + 1)
        shapes.setdefault(shape, []).append(index)
    return list(shapes.values())


def part_name(group: str, part: int) -> str:
    """The worker's name of run ``part`` of :func:`same_shape` in ``group``."""
    return f"{group}#{part}"


def runnable_protocols(protocols, lengths, max_positions: int) -> tuple[str, ...]:
    """``protocols`` without ``decode`` when no length leaves room for a stretch (the project
    does not run it there either), with a line saying so."""
    if "decode" in protocols and not any(decode_stretch(n, max_positions) for n in lengths):
        print(f"decode protocol left out: no room for a stretch at {list(lengths)} bytes")
        return tuple(p for p in protocols if p != "decode")
    return tuple(protocols)


def recall_job(
    groups: dict,
    protocols,
    max_positions: int,
    batch: int,
    presses: tuple[str, ...] = PRESSES,
    budgets: tuple[str, ...] = tuple(BUDGETS),
) -> dict:
    """The worker's recall job (without the model folder): ``presses`` at ``budgets``, and each
    group's prompt and answer ids, its tokens kept per budget (:data:`BUDGETS` at every length,
    as the recall benchmark's methods keep), question cut and decode stretch."""
    return {
        "mode": "recall",
        "presses": list(presses),
        "budgets": list(budgets),
        "protocols": list(protocols),
        "batch": batch,
        "decode_interval": DECODE_INTERVAL,
        "groups": [
            {
                "name": part_name(name, part),
                "prompts": [encode(items[i].prompt).tolist() for i in indices],
                "answers": [encode(items[i].answer).tolist() for i in indices],
                "kept": dict(BUDGETS),
                "cut": question_cut([items[i] for i in indices]),
                "stretch": decode_stretch(items[0].context_length, max_positions),
            }
            for name, items in groups.items()
            for part, indices in enumerate(same_shape(items))
        ],
    }


def join_parts(outcome: dict, groups: dict[str, list[RecallItem]]) -> dict[str, list]:
    """A worker outcome keyed by :func:`part_name` as ``{group: answers in item order}``;
    ``ValueError`` naming a part of no group of ``groups``. A group the worker left out (the
    decode protocol without a stretch) stays out."""
    parts = {part_name(g, p): (g, indices) for g, items in groups.items()
             for p, indices in enumerate(same_shape(items))}  # fmt: skip
    unknown = sorted(set(outcome) - set(parts))
    if unknown:
        raise ValueError(f"unknown groups {unknown}")
    joined: dict[str, list] = {}
    for name, answers in outcome.items():
        group, indices = parts[name]
        slots = joined.setdefault(group, [None] * len(groups[group]))
        for index, answer in zip(indices, answers, strict=True):
            slots[index] = answer
    return joined


def exact_answers(tokens: list, items: list[RecallItem]) -> list[float]:
    """1.0 per item whose greedy answer ``tokens`` (one list per item) equals its answer bytes
    in every position, else 0.0 (as
    :func:`kvpop_compile.evaluation.recall.protocol.answer_exactly`)."""
    if len(tokens) != len(items):
        raise ValueError(f"{len(tokens)} answers for {len(items)} items")
    exact = []
    for answer, item in zip(tokens, items, strict=True):
        expected = encode(item.answer)  # (A,)
        if len(answer) != expected.numel():
            raise ValueError(f"an answer of {len(answer)} tokens for {item.answer!r}")
        exact.append(float(torch.equal(torch.tensor(answer, dtype=torch.long), expected)))
    return exact


def summarise_recall(worker_result: dict, groups: dict[str, list[RecallItem]]) -> dict:
    """Per press, budget and protocol: ``{"task@length": [1.0/0.0 per item]}``, or the error.

    ``worker_result`` is what the worker writes for a recall job (greedy answer tokens per
    item). A failed run is kept as ``{"error": message}`` and listed under ``errors`` as
    ``"press budget protocol: message"``; ``exact_match`` holds each group's mean.
    """
    results: dict[str, dict] = {}
    means: dict[str, dict] = {}
    errors = []
    for press, budgets in worker_result["results"].items():
        results[press], means[press] = {}, {}
        for budget, protocols in budgets.items():
            results[press][budget], means[press][budget] = {}, {}
            for protocol, outcome in protocols.items():
                if "error" in outcome:
                    results[press][budget][protocol] = {"error": outcome["error"]}
                    errors.append(f"{press} {budget} {protocol}: {outcome['error']}")
                    continue
                try:
                    joined = join_parts(outcome, groups)
                except ValueError as error:
                    raise ValueError(f"{press} {budget} {protocol}: {error}") from None
                exact = {g: exact_answers(tokens, groups[g]) for g, tokens in joined.items()}
                results[press][budget][protocol] = exact
                means[press][budget][protocol] = {g: sum(v) / len(v) for g, v in exact.items()}
    return {
        "versions": worker_result["versions"],
        "results": results,
        "exact_match": means,
        "errors": errors,
    }


def ensure_venv(venv: Path) -> Path:
    """The Python of ``venv``, creating the venv and installing kvpress first if needed."""
    python = venv / "bin" / "python"
    if python.exists() and _run_quiet([python, "-c", "import kvpress"]):
        return python
    start = time.perf_counter()
    print(f"creating {venv} ({TORCH_PIN}, {KVPRESS_PIN})", flush=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # torch first, pinned: kvpress alone would pull the default (multi-GB CUDA) build.
    subprocess.run([python, "-m", "pip", "install", "-q", TORCH_PIN], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", TORCH_PIN, KVPRESS_PIN], check=True)
    print(f"venv ready in {time.perf_counter() - start:.0f} s", flush=True)
    return python


def _run_quiet(command: list) -> bool:
    return subprocess.run(command, capture_output=True).returncode == 0


def snapshot_checkpoint(source: Path, target: Path, tries: int = 3) -> str:
    """Copy the checkpoint's files into ``target``; the SHA-256 of the weights copied.

    The shipped folder may be rewritten (file by file) while the benchmark runs; the worker
    reads the copy, so one run sees one checkpoint, and the hash says which. A copy during
    which a file changed is taken again.
    """
    target.mkdir()
    for _ in range(tries):
        before = [_stamp(source / name) for name in CHECKPOINT_FILES]
        for name in CHECKPOINT_FILES:
            shutil.copyfile(source / name, target / name)
        if before == [_stamp(source / name) for name in CHECKPOINT_FILES]:
            return hashlib.sha256((target / "model.safetensors").read_bytes()).hexdigest()
        time.sleep(1.0)
    raise RuntimeError(f"checkpoint {str(source)!r} kept changing while it was copied")


def _stamp(path: Path) -> tuple[int, int, int]:
    status = path.stat()
    return status.st_ino, status.st_size, status.st_mtime_ns


def run_worker(python: Path, job: dict, scratch: Path) -> dict:
    """Run the worker on ``job`` in kvpress's venv; what it writes. Its progress lines go
    straight to our stdout."""
    (scratch / "job.json").write_text(json.dumps(job))
    command = [python, WORKER, scratch / "job.json", scratch / "result.json"]
    subprocess.run([str(part) for part in command], check=True)
    return json.loads((scratch / "result.json").read_text())


def write_summary(out: Path, summary: dict) -> None:
    """Write ``summary`` to ``out`` atomically (its folder created if missing)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, lambda tmp: Path(tmp).write_text(json.dumps(summary, indent=1)))


def _weights_sha256(model: Path) -> str:
    """The fingerprint of ``model``'s weights that ``kvpop-compile eval`` records
    (``model_sha256``): the reports join kvpress rows only from the same weights."""
    return weights_sha256(load_embedded_model(path=model))


def run_sequences(args: argparse.Namespace, python: Path) -> None:
    """The prompt-compression protocol on the held-out sequences, into ``args.out``."""
    sequences = held_out_sequences(args.sequences)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        sha256 = snapshot_checkpoint(args.model, scratch / "model")
        job = {
            "model": str(scratch / "model"),
            "sequences": [s.ids.tolist() for s in sequences],
            "prompt_length": PROMPT_LENGTH,
            "budgets": BUDGETS,
            "presses": list(PRESSES),
        }
        worker_result = run_worker(python, job, scratch)
    summary = summarise(worker_result, sequences, PROMPT_LENGTH)
    summary.update(
        protocol=PROTOCOL,
        sequence_count=len(sequences),
        prompt_length=PROMPT_LENGTH,
        budgets={"0%": PROMPT_LENGTH, **BUDGETS},
        window=WINDOW,
        checkpoint_sha256=sha256,
        model_sha256=_weights_sha256(args.model),
        elapsed_s=round(time.perf_counter() - start, 1),
    )
    write_summary(args.out, summary)
    for press, budgets in summary["results"].items():
        for budget, figures in budgets.items():
            shown = figures.get("error") or (
                f"accuracy {figures['accuracy']:.4f}, NLL {figures['nll']:.4f}"
            )
            print(f"{press:>20} {budget:>4}: {shown}")
    print(f"wrote {args.out} ({summary['elapsed_s']:.0f} s)")


def run_recall(args: argparse.Namespace, python: Path) -> None:
    """The recall items under both protocols, into ``args.out``."""
    groups = recall_groups(TASKS, args.lengths, args.items, RECALL_SEED, args.families)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        sha256 = snapshot_checkpoint(args.model, scratch / "model")
        config = json.loads((scratch / "model" / "config.json").read_text())
        max_positions = config["max_position_embeddings"]
        protocols = runnable_protocols(args.protocols, args.lengths, max_positions)
        job = recall_job(groups, protocols, max_positions, args.batch, args.presses, args.budgets)
        worker_result = run_worker(python, {**job, "model": str(scratch / "model")}, scratch)
    summary = summarise_recall(worker_result, groups)
    summary.update(
        protocol=RECALL_PROTOCOL,
        items=args.items,
        tasks=list(TASKS),
        families=list(args.families),
        lengths=list(args.lengths),
        protocols=list(protocols),
        seed=RECALL_SEED,
        stretch={str(n): decode_stretch(n, max_positions) for n in args.lengths},
        budgets={str(n): {b: BUDGETS[b] for b in args.budgets} for n in args.lengths},
        decode_interval=DECODE_INTERVAL,
        checkpoint_sha256=sha256,
        model_sha256=_weights_sha256(args.model),
        elapsed_s=round(time.perf_counter() - start, 1),
    )
    write_summary(args.out, summary)
    for press, budgets in summary["results"].items():
        for budget, protocols in budgets.items():
            for protocol, outcome in protocols.items():
                means = summary["exact_match"][press][budget].get(protocol, {})
                shown = outcome.get("error") or ", ".join(
                    f"{g} {100 * v:.1f}%" for g, v in means.items()
                )
                print(f"{press:>20} {budget:>4} {protocol:>7}: {shown}")
    print(f"wrote {args.out} ({summary['elapsed_s']:.0f} s)")


def _names(text: str, known: tuple, what: str) -> tuple:
    """``text`` split at commas, each name checked against ``known`` (an ``ArgumentTypeError``
    naming the bad one)."""
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    for name in names:
        if name not in known:
            raise argparse.ArgumentTypeError(
                f"{what} must be among {', '.join(map(str, known))}; got {name!r}"
            )
    if not names:
        raise argparse.ArgumentTypeError(f"no {what} given in {text!r}")
    return names


def _lengths(text: str) -> tuple[int, ...]:
    """Recall lengths ``"1024,2048"`` as integers, each one the benchmark asks at."""
    return tuple(int(n) for n in _names(text, tuple(map(str, CONTEXT_LENGTHS)), "lengths"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--recall", action="store_true", help="ask the held-out recall items")
    parser.add_argument("--items", type=int, default=64, help="recall items per task and length")
    parser.add_argument(
        "--lengths", type=_lengths, default=CONTEXT_LENGTHS, help="recall lengths (1024,2048)"
    )
    parser.add_argument(
        "--protocols", default=RECALL_PROTOCOLS, help="recall protocols (prefill,decode)",
        type=lambda text: _names(text, RECALL_PROTOCOLS, "protocols"),
    )  # fmt: skip
    parser.add_argument(
        "--families", default=RECALL_FAMILIES, help="recall family groups (train,held_out)",
        type=lambda text: _names(text, FAMILY_SPLITS, "families"),
    )  # fmt: skip
    parser.add_argument(
        "--presses", default=PRESSES, help=f"with --recall: the presses run ({','.join(PRESSES)})",
        type=lambda text: _names(text, PRESSES, "presses"),
    )  # fmt: skip
    parser.add_argument(
        "--budgets", default=tuple(BUDGETS), type=lambda text: _names(text, tuple(BUDGETS),
        "budgets"), help=f"with --recall: the budgets the presses keep ({','.join(BUDGETS)})",
    )  # fmt: skip
    parser.add_argument("--batch", type=int, default=16, help="recall items per forward")
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv-kvpress")
    parser.add_argument(
        "--model", type=Path, default=EMBEDDED_MODEL,
        help="byte-level Qwen3 checkpoint folder (default: the embedded model)",
    )  # fmt: skip
    parser.add_argument(
        "--out", type=Path, help="results file (benchmarks/results/kvpress.json, or "
        "kvpress_recall.json with --recall)",
    )  # fmt: skip
    parser.add_argument(
        "--merge", type=Path, nargs="+", metavar="FILE",
        help="join recall files of the same items into --out (later files win); runs nothing",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.merge is not None:
        if args.out is None:
            parser.error("--merge writes to --out: give --out FILE")
        missing = [str(path) for path in args.merge if not path.is_file()]
        if missing:
            parser.error(f"--merge: no such file: {', '.join(missing)}")
        try:
            merge_files(args.merge, args.out)
        except ValueError as error:
            parser.error(f"--merge: {error}")
        return
    for name in ("sequences", "items", "batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if not (args.model / "config.json").is_file():
        parser.error(f"--model {args.model}: no config.json there; give a checkpoint folder")
    chosen = (args.presses, args.budgets) != (PRESSES, tuple(BUDGETS))
    if chosen and not args.recall:
        parser.error("--presses and --budgets choose among the recall runs: give --recall too")
    if args.out is None:
        name = "kvpress_recall.json" if args.recall else "kvpress.json"
        args.out = ROOT / "benchmarks/results" / name

    python = ensure_venv(args.venv.resolve())
    (run_recall if args.recall else run_sequences)(args, python)


if __name__ == "__main__":
    main()
