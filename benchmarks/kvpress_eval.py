"""kvpress's presses on the embedded model under the prompt-compression protocol.

NVIDIA's kvpress pins a transformers older than kvpop_compile needs, so its presses run in a
virtual environment of their own (created on first use) through
:mod:`benchmarks.kvpress_worker`; this driver, in the project's environment, hands it the
benchmark sequences and summarises what it measures into one JSON file that the quality
benchmark reads::

    python benchmarks/kvpress_eval.py [--sequences 64] [--venv .venv-kvpress]
        [--out benchmarks/results/kvpress.json]
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

import torch  # noqa: E402

from kvpop_compile.atomic import atomic_write  # noqa: E402
from kvpop_compile.embedded.model import EMBEDDED_MODEL  # noqa: E402
from kvpop_compile.evaluation.data import (  # noqa: E402
    PROMPT_LENGTH,
    Sequence,
    held_out_sequences,
)
from kvpop_compile.evaluation.long_range import long_range_targets  # noqa: E402
from kvpop_compile.evaluation.methods import BUDGETS, WINDOW  # noqa: E402

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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv-kvpress")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/kvpress.json")
    args = parser.parse_args(argv)
    if args.sequences < 1:
        parser.error(f"--sequences must be >= 1, got {args.sequences}")

    python = ensure_venv(args.venv.resolve())
    sequences = held_out_sequences(args.sequences)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        sha256 = snapshot_checkpoint(EMBEDDED_MODEL, scratch / "model")
        job = {
            "model": str(scratch / "model"),
            "sequences": [s.ids.tolist() for s in sequences],
            "prompt_length": PROMPT_LENGTH,
            "budgets": BUDGETS,
            "presses": list(PRESSES),
        }
        (scratch / "job.json").write_text(json.dumps(job))
        # The worker's progress lines go straight to our stdout.
        command = [python, WORKER, scratch / "job.json", scratch / "result.json"]
        subprocess.run([str(part) for part in command], check=True)
        worker_result = json.loads((scratch / "result.json").read_text())
    summary = summarise(worker_result, sequences, PROMPT_LENGTH)
    summary.update(
        protocol=PROTOCOL,
        sequence_count=len(sequences),
        prompt_length=PROMPT_LENGTH,
        budgets={"0%": PROMPT_LENGTH, **BUDGETS},
        window=WINDOW,
        checkpoint_sha256=sha256,
        elapsed_s=round(time.perf_counter() - start, 1),
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out, lambda tmp: Path(tmp).write_text(json.dumps(summary, indent=1)))
    for press, budgets in summary["results"].items():
        for budget, figures in budgets.items():
            shown = figures.get("error") or (
                f"accuracy {figures['accuracy']:.4f}, NLL {figures['nll']:.4f}"
            )
            print(f"{press:>20} {budget:>4}: {shown}")
    print(f"wrote {args.out} ({summary['elapsed_s']:.0f} s)")


if __name__ == "__main__":
    main()
