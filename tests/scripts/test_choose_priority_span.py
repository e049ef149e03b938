"""``scripts/choose_priority_span.py``: a saved scorer's span chosen on validation recall items."""

import dataclasses
import json
import os
import stat

import pytest
from script_support import copy_of_shipped_scorer, load_script

import kvpop_compile as kc
from kvpop_compile.embedded import load_embedded_model
from kvpop_compile.embedded.recall import TASKS, recall_items
from kvpop_compile.evaluation.methods import scorer_folder
from kvpop_compile.evaluation.recall.protocol import answer_probability
from kvpop_compile.fingerprints import items_sha256
from kvpop_compile.scorer_io import read_tensors, saved_config, tensors_sha256


def _script():
    return load_script("scripts/choose_priority_span.py")


def test_the_highest_mean_wins_unless_its_lead_over_the_saved_span_is_a_tie():
    kept = _script().kept_span
    assert kept({6: 0.95, 8: 0.9628, 10: 0.9615}, saved=10) == 8
    assert kept({6: 0.96281, 8: 0.96289, 10: 0.9628}, saved=10) == 10  # leads by <= 1e-4
    assert kept({6: 0.9630, 8: 0.9640, 10: 0.9620}, saved=10) == 8
    with pytest.raises(ValueError, match=r"non-finite .* priority_span \{6: nan\}"):
        kept({6: float("nan"), 10: 0.9}, saved=10)


@pytest.mark.parametrize(
    "arguments, message",
    [
        ("--spans -1 {saved}", "--spans must be integers >= 0, got -1"),
        ("--spans 4 4 {saved}", "lists a span twice: 4 4 {saved}"),
        ("--spans 1 2", "--spans 1 2 leaves out {saved}, the span the folder is saved with"),
        ("--spans {saved} --items 0", "--items must be 1 or more, got 0"),
        ("--spans {saved} --threads 0", "--threads must be 1 or more, got 0"),
    ],
)
def test_bad_arguments_are_refused_by_name(tmp_path, arguments, message):
    folder = copy_of_shipped_scorer(tmp_path)
    saved = saved_config(folder).priority_span
    with pytest.raises(SystemExit, match=message.format(saved=saved)):
        _script().main([str(folder), *arguments.format(saved=saved).split()])


def test_the_measure_is_the_mean_answer_probability_at_each_span(tmp_path):
    folder = copy_of_shipped_scorer(tmp_path)
    saved = saved_config(folder)
    _script().main([str(folder), "--spans", str(saved.priority_span), "2", "--items", "1"])
    selection = json.loads((folder / "training.json").read_text())["priority_span_selection"]
    measured = {m["priority_span"]: m["select"] for m in selection["measured"]}
    assert list(measured) == [saved.priority_span, 2]
    # Each measure is the mean answer probability of the scorer loaded as saved for that span,
    # on validation code in the trained and the validation families, never the held-out ones.
    assert (selection["split"], selection["families"]) == ("validation", ["train", "validation"])
    items = [recall_items("validation", task, 2048, 1, 99, families=families)[0]
             for families in ("train", "validation") for task in TASKS]  # fmt: skip
    assert selection["items_sha256"] == items_sha256(items)
    model = kc.transform(load_embedded_model(), dataclasses.replace(saved, priority_span=2))
    kc.load_scorer(model, folder)
    expected = sum(answer_probability(model, [item], "prefill")[0] for item in items) / len(items)
    assert measured[2] == pytest.approx(expected, rel=1e-9)


def test_the_folder_is_rewritten_whole_with_the_winning_span_and_the_same_tensors(
    tmp_path, monkeypatch
):
    script = _script()
    folder = copy_of_shipped_scorer(tmp_path)
    (folder / "NOTES.txt").write_text("mine")
    saved = saved_config(folder).priority_span
    before = json.loads((folder / "training.json").read_text())
    means = {saved: 0.90, 3: 0.95, 5: 0.93}  # 3 wins by far more than a tie

    def fixed_measure(model_path, config, groups, measure):
        return lambda scorer: means[config.priority_span]

    monkeypatch.setattr(script, "recall_selection", fixed_measure)
    old_umask = os.umask(0o022)
    try:
        script.main([str(folder), "--spans", str(saved), "3", "5", "--items", "1"])
        script.main([str(folder), "--spans", "3", "5", "--items", "1"])  # 5 does not beat 3
    finally:
        os.umask(old_umask)
    assert saved_config(folder).priority_span == 3
    assert tensors_sha256(folder) == tensors_sha256(scorer_folder("memory", 256))
    assert read_tensors(folder).keys() == read_tensors(scorer_folder("memory", 256)).keys()
    assert (folder / "NOTES.txt").read_text() == "mine"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    record = json.loads((folder / "training.json").read_text())
    latest = record.pop("priority_span_selection")
    # The training record is otherwise kept; the first choice moved under the second's.
    assert record == {k: v for k, v in before.items() if k != "priority_span_selection"}
    assert (latest["saved_before"], latest["kept"]) == (3, 3)
    first = latest["replaces"]
    assert (first["saved_before"], first["kept"]) == (saved, 3)
    assert first["measured"] == [{"priority_span": s, "select": means[s]} for s in (saved, 3, 5)]
    assert first.get("replaces") == before.get("priority_span_selection")
