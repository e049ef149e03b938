"""``scripts/choose_priority_span.py``: a saved scorer's span chosen on validation recall items."""

import dataclasses
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

import kvpop_compile as kc
from kvpop_compile.embedded import load_embedded_model
from kvpop_compile.embedded.recall import TASKS, recall_items
from kvpop_compile.evaluation.methods import scorer_folder
from kvpop_compile.evaluation.recall import answer_probability
from kvpop_compile.scorer_io import read_tensors, saved_config, tensors_sha256

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "choose_priority_span.py"


def _script():
    spec = importlib.util.spec_from_file_location("choose_priority_span", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_highest_mean_wins_and_a_tie_keeps_the_saved_span():
    kept = _script().kept_span
    assert kept({6: 0.95, 8: 0.9628, 10: 0.9615}, saved=10) == 8
    assert kept({6: 0.96281, 8: 0.96284, 10: 0.9628}, saved=10) == 10  # equal to 4 places
    assert kept({6: 0.96281, 8: 0.96284, 10: 0.5}, saved=10) == 6  # the saved one lost


@pytest.mark.parametrize(
    "spans, message",
    [(["-1"], "--spans must be integers >= 0, got -1"), (["4", "4"], "lists a span twice: 4 4")],
)
def test_bad_spans_are_refused_by_name(tmp_path, spans, message):
    with pytest.raises(SystemExit, match=message):
        _script().main([str(tmp_path), "--spans", *spans])


def test_the_folder_is_rewritten_with_the_kept_span_and_the_same_tensors(tmp_path):
    folder = tmp_path / "memory-256"
    shutil.copytree(scorer_folder("memory", 256), folder)
    before = json.loads((folder / "training.json").read_text())
    saved = saved_config(folder)
    _script().main([str(folder), "--spans", str(saved.priority_span), "2", "--items", "1"])
    record = json.loads((folder / "training.json").read_text())
    selection = record.pop("priority_span_selection")
    assert record == {k: v for k, v in before.items() if k != "priority_span_selection"}
    measured = {m["priority_span"]: m["select"] for m in selection["measured"]}
    assert list(measured) == [saved.priority_span, 2]
    assert selection["saved_before"] == saved.priority_span
    assert selection["kept"] == _script().kept_span(measured, saved.priority_span)
    # Each measure is the mean answer probability of the scorer loaded as saved for that span.
    items = [recall_items("validation", task, 2048, 1, 99)[0] for task in TASKS]
    model = kc.transform(load_embedded_model(), dataclasses.replace(saved, priority_span=2))
    kc.load_scorer(model, folder)
    assert measured[2] == pytest.approx(
        sum(answer_probability(model, [item], "prefill")[0] for item in items) / len(TASKS),
        rel=1e-9,
    )
    # The folder holds the same tensors, saved for the kept span.
    assert tensors_sha256(folder) == tensors_sha256(scorer_folder("memory", 256))
    assert read_tensors(folder).keys() == read_tensors(scorer_folder("memory", 256)).keys()
    assert saved_config(folder).priority_span == selection["kept"]
