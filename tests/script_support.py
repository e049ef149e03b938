"""Loading the repository's scripts and benchmarks, which are files rather than packages, and
the shipped scorer folders the scripts rewrite, copied."""

import importlib.util
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


def copy_of_shipped_scorer(tmp_path: Path, policy: str = "memory", capacity: int = 256) -> Path:
    """A copy of the shipped ``<policy>-<capacity>`` scorer folder in ``tmp_path``, for a script
    that rewrites the folder it is given."""
    from kvpop_compile.evaluation.methods import scorer_folder

    folder = tmp_path / f"{policy}-{capacity}"
    shutil.copytree(scorer_folder(policy, capacity), folder)
    return folder
