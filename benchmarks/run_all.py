"""Run the performance benchmarks and write their tables and plots.

    python benchmarks/run_all.py            # the full suite (about an hour on a 2-core CPU)
    python benchmarks/run_all.py --quick    # tiny sizes and eager paths only: checks it runs
    python benchmarks/run_all.py --quick --only bench   # kvpop-compile bench's code, tiny

The ``bench`` family is ``kvpop-compile bench`` (:mod:`kvpop_compile.evaluation.bench.run`)
on a small model; ``--quick`` runs it only when ``--only bench`` names it, so the quick suite's
families stay the four CI checks.

Writes ``performance.md`` (method, tables, targets), ``performance.json`` (every sample) and
PNG plots (matplotlib) to ``benchmarks/results/``, or ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository's packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import transformers  # noqa: E402

import kvpop_compile as kc  # noqa: E402
from benchmarks import long_decode, policy_overhead, prefill, target_pass  # noqa: E402
from benchmarks.harness import Section, qwen3_model  # noqa: E402
from benchmarks.plots import matplotlib_available  # noqa: E402
from kvpop_compile.evaluation.bench.report import (  # noqa: E402
    COLUMN_NOTES,
    bench_json,
    bench_setup,
    bench_table,
    plot_bench,
)
from kvpop_compile.evaluation.bench.run import cpu_name, run_bench  # noqa: E402
from kvpop_compile.evaluation.bench.settings import METHODS, BenchSettings  # noqa: E402

FAMILIES = ("decode", "policy", "target", "prefill", "bench")
QUICK_FAMILIES = ("decode", "policy", "target", "prefill")  # what --quick runs unless --only
RESULTS = Path(__file__).resolve().parent / "results"
# kvpop-compile bench on two layers of Qwen3-0.6B shapes with a small vocabulary (so that the LM
# head does not dominate the step), every method but the AOTInductor engine, whose export the
# decode family already measures.
BENCH_FULL = dict(
    shape="qwen3-0.6b", layers=2, vocab=512,
    settings=BenchSettings(contexts=(2048, 8192), decode_tokens=8, warmup=3,
                           kvpop_config=kc.KVpopConfig(sinks=4, window=128, topk=892)),
)  # fmt: skip
BENCH_QUICK = dict(
    shape="tiny", layers=1, vocab=256,
    settings=BenchSettings(contexts=(32, 96), methods=("dynamic", "eager"), decode_tokens=2,
                           warmup=1, kvpop_config=kc.KVpopConfig(sinks=2, window=8, topk=22)),
)  # fmt: skip


def _model_step(decode: Section | None, quick: bool) -> policy_overhead.ModelStep | None:
    """The decode benchmark's whole-model figures for the policy benchmark, if it ran."""
    if decode is None:
        return None
    settings = long_decode.QUICK if quick else long_decode.FULL
    compiled = (policy_overhead.QUICK if quick else policy_overhead.FULL).compiled
    path = long_decode.KVPOP_COMPILED if compiled else long_decode.KVPOP_EAGER
    kvpop_ms = long_decode.median_ms(decode, path, settings.contexts[-1])
    if kvpop_ms is None:
        return None
    capacity = settings.kvpop_config.capacity
    at_capacity = (
        long_decode.median_ms(decode, long_decode.KVPOP_COMPILED, capacity),
        long_decode.median_ms(decode, long_decode.STATIC, capacity),
    )
    return policy_overhead.ModelStep(
        layers=settings.layers,
        kvpop_ms=kvpop_ms,
        at_capacity=at_capacity if None not in at_capacity else None,
    )


def bench_section(quick: bool) -> Section:
    """``kvpop-compile bench``'s measurements on a small model, as one of the suite's sections."""
    spec = BENCH_QUICK if quick else BENCH_FULL
    settings = spec["settings"]
    longest = max(*settings.contexts, settings.kvpop_config.capacity)
    model = qwen3_model(
        spec["shape"], layers=spec["layers"], vocab=spec["vocab"], max_positions=2 * longest
    )
    name = f"`{spec['shape']}` shape, vocabulary {spec['vocab']}, random weights"
    result = run_bench(model, settings, model_name=name, progress=False)
    section = Section(
        title="Prefill and decode end to end (kvpop-compile bench)",
        method=(
            "What `kvpop-compile bench` measures on a user's machine "
            "(`kvpop_compile.evaluation.bench.run`): for each N, a random N-token prompt "
            "runs into a new cache and decode steps follow; methods: "
            f"{', '.join(METHODS[m] for m in settings.methods)}. {bench_setup(result)}"
        ),
        tables=[bench_table(result), COLUMN_NOTES],
        notes=result.notes,
        data=bench_json(result),
    )
    section.plots = {"long_context.png": lambda path: plot_bench(result, path)}
    return section


def run_families(families: list[str], quick: bool) -> list[Section]:
    def pick(module):
        return module.QUICK if quick else module.FULL

    sections: dict[str, Section] = {}
    for family in families:
        start = time.perf_counter()
        print(f"[{family}] running", flush=True)
        if family == "decode":
            sections[family] = long_decode.run(pick(long_decode))
        elif family == "policy":
            model = _model_step(sections.get("decode"), quick)
            sections[family] = policy_overhead.run(pick(policy_overhead), model)
        elif family == "target":
            sections[family] = target_pass.run(pick(target_pass))
        elif family == "prefill":
            sections[family] = prefill.run(pick(prefill))
        else:
            sections[family] = bench_section(quick)
        print(f"[{family}] done in {time.perf_counter() - start:.0f} s", flush=True)
    return list(sections.values())


def _commit() -> str:
    """The repository's commit, with a mark when the tree differs from it; '' outside git."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, text=True, capture_output=True, check=True)
        return done.stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return ""
    return f"commit {commit}{' with local changes' if dirty else ''}, "


def _environment(load_before: tuple[float, ...]) -> str:
    cpu = cpu_name()
    load_after = os.getloadavg() if hasattr(os, "getloadavg") else ()
    load = " → ".join(f"{value[0]:.2f}" for value in (load_before, load_after) if value)
    return (
        f"{_commit()}{cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads; torch "
        f"{torch.__version__}, transformers {transformers.__version__}, Python "
        f"{platform.python_version()}. 1-minute load average at start → end: {load}."
    )


def write_results(sections: list[Section], out: Path, *, command: str, wall: float,
                  environment: str) -> list[str]:  # fmt: skip
    """Write ``performance.md``, ``performance.json`` and the plots; returns the files."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    plotted: dict[str, list[str]] = {}
    for section in sections:
        plotted[section.title] = [name for name, draw in section.plots.items() if draw(out / name)]
        written += plotted[section.title]
    targets = [target.line() for section in sections for target in section.targets]
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "# Performance",
        f"`{command}` — {stamp}, {wall / 60:.1f} minutes.\n\n{environment}",
        "Absolute times depend on the machine and on what else runs on it; the ratios "
        "between paths measured one after the other in this run are the figures to compare.",
    ]
    if not matplotlib_available():
        parts.append("Plots skipped: matplotlib is not installed (`pip install matplotlib`).")
    if targets:
        parts.append("## Targets\n\n" + "\n".join(targets))
    parts += [section.markdown(plotted[section.title]) for section in sections]
    (out / "performance.md").write_text("\n\n".join(parts) + "\n")
    data = {section.title: section.data for section in sections}
    (out / "performance.json").write_text(json.dumps(data, indent=1) + "\n")
    return ["performance.md", "performance.json", *written]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, eager paths (CI)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    parser.add_argument(
        "--only", action="append", choices=FAMILIES, help="run this family (repeatable)"
    )
    parser.add_argument(
        "--threads", type=int, help="torch intra-op threads (default: torch's, one per core)"
    )
    args = parser.parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    default = QUICK_FAMILIES if args.quick else FAMILIES
    families = [f for f in FAMILIES if (f in default if args.only is None else f in args.only)]
    command = "python benchmarks/run_all.py" + "".join(
        f" {shlex.quote(a)}" for a in (argv if argv is not None else sys.argv[1:])
    )
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else ()
    start = time.perf_counter()
    sections = run_families(families, args.quick)
    wall = time.perf_counter() - start
    files = write_results(
        sections, args.out, command=command, wall=wall, environment=_environment(load_before)
    )
    print(f"wrote {', '.join(files)} to {args.out} in {wall:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
