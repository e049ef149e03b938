"""Loading the repository's scripts and benchmarks, which are files rather than packages, and
the shipped scorer folders the scripts rewrite, copied."""

import importlib.util
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative: str):
    """The module in ``ROOT / relative`` (``"scripts/choose_priority_span.py"``), executed afresh
    each call so that a test's monkeypatching never leaks into another's, and registered in
    ``sys.modules`` under its file's stem (dataclasses look their module up there)."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def copy_of_shipped_scorer(
    tmp_path: Path, policy: str = "memory", capacity: int = 256, *, one_budget: bool = True
) -> Path:
    """A copy of the shipped ``<policy>-<capacity>`` scorer folder in ``tmp_path``, for a script
    that rewrites the folder it is given. ``one_budget``: saved at the one budget it had before
    its memory was shared between the layers, at the lam it had then (the first budget the
    first ``choose_layer_budgets.py`` run on it measured; later runs' records keep earlier ones
    under ``replaces``), as the scripts that choose a window, recency term, span or streaming heads
    take it; tensors unchanged."""
    from kvpop_compile.evaluation.methods import scorer_folder

    folder = tmp_path / f"{policy}-{capacity}"
    shutil.copytree(scorer_folder(policy, capacity), folder)
    if one_budget:
        record = json.loads((folder / "training.json").read_text())["layer_budget_selection"]
        while "replaces" in record:
            record = record["replaces"]
        first = record["measured"][0]
        description = json.loads((folder / "scorer.json").read_text())
        # that run measured one lam (its record's) or a lam per setting (each entry's)
        lam = first.get("lam", record["lam"])
        description["kvpop_config"].update(window=first["window"][0], topk=first["topk"][0],
                                           lam=lam)  # fmt: skip
        (folder / "scorer.json").write_text(json.dumps(description, indent=2) + "\n")
    return folder
