"""``scripts/choose_recency.py``: a saved scorer's window and recency term chosen on validation
text and recall."""

import dataclasses
import json
import statistics

import pytest
import torch
from script_support import copy_of_shipped_scorer, load_script

import kvpop_compile as kc
from kvpop_compile.embedded import load_embedded_model
from kvpop_compile.evaluation.data import validation_sequences
from kvpop_compile.evaluation.methods import WINDOW, budget_config, scorer_folder
from kvpop_compile.evaluation.protocols import teacher_forced
from kvpop_compile.evaluation.quality.long_range import long_range_targets
from kvpop_compile.scorer_io import load_layers, read_tensors, saved_config, tensors_sha256


def _script():
    return load_script("scripts/choose_recency.py")


def _measure(recall: float, margin_all: float, margin_long: float) -> dict:
    return {"recall": recall, "text_margin": {"all": margin_all, "long_range": margin_long}}


def test_best_recall_among_settings_that_keep_windows_text_else_the_closest_to_it():
    kept = _script().kept_setting
    saved = (96, 0.0)
    # The saved setting loses text to the window; two others keep it, (128, 0.01) recalls more.
    measured = {saved: _measure(0.9, -0.02, -0.05), (128, 0.01): _measure(0.6, 0.0, 0.001),
                (96, 0.03): _measure(0.4, 0.01, 0.02)}  # fmt: skip
    assert kept(measured, saved=saved) == (128, 0.01)
    # A margin on long-range targets below 0 disqualifies however high the recall.
    measured[128, 0.01] = _measure(0.95, 0.01, -0.001)
    assert kept(measured, saved=saved) == (96, 0.03)
    # None keeps window's text: the one whose worse margin is least negative.
    none = {saved: _measure(0.9, -0.02, -0.05), (160, 0.0): _measure(0.5, -0.001, -0.004),
            (96, 0.03): _measure(0.2, 0.002, -0.006)}  # fmt: skip
    assert kept(none, saved=saved) == (160, 0.0)
    # Among eligible settings the saved one stays on a tie (a lead of at most 1e-4) ...
    tie = {saved: _measure(0.9, 0.0, 0.0), (128, 0.0): _measure(0.90005, 0.01, 0.01)}
    assert kept(tie, saved=saved) == saved
    # ... and loses to a lead beyond it.
    lead = {saved: _measure(0.9, 0.0, 0.0), (128, 0.0): _measure(0.9002, 0.01, 0.01)}
    assert kept(lead, saved=saved) == (128, 0.0)
    with pytest.raises(ValueError, match=r"non-finite recall measure at \(window, lam\) "
                       r"\[\(96, 0.01\)\]"):  # fmt: skip
        kept({saved: _measure(0.9, 0, 0), (96, 0.01): _measure(float("nan"), 0, 0)}, saved=saved)


def test_a_lead_inside_the_noise_of_the_paired_items_is_a_tie():
    script = _script()
    saved = (96, 0.0)
    base = [0.2, 0.4, 0.6, 0.8, 0.5, 0.3]
    noisy = [0.3, -0.28, 0.3, -0.28, 0.3, -0.28]  # a mean lead of 0.01, in noise
    steady = [0.01] * 6  # the same mean lead on every item
    for differences, expected in ((noisy, saved), (steady, (128, 0.0))):
        measured = {
            saved: {**_measure(sum(base) / 6, 0.0, 0.0), "recall_items": base},
            (128, 0.0): {
                **_measure(sum(b + d for b, d in zip(base, differences, strict=True)) / 6,
                           0.01, 0.01),
                "recall_items": [b + d for b, d in zip(base, differences, strict=True)],
            },
        }  # fmt: skip
        needed = script.lead_needed(measured[128, 0.0], measured[saved])
        assert needed == pytest.approx(max(1e-4, 2 * statistics.stdev(differences) / 6**0.5))
        assert script.kept_setting(measured, saved=saved) == expected
    # By hand: each noisy difference is 0.29 from their mean, so the standard deviation is
    # 0.29 * sqrt(6 / 5) and twice the standard error 2 * 0.29 / sqrt(5).
    noisy_lead = {"recall_items": [b + d for b, d in zip(base, noisy, strict=True)]}
    assert script.lead_needed(noisy_lead, {"recall_items": base}) == pytest.approx(0.58 / 5**0.5)
    # Without per-item values (choose_recency.py's own measures) the margin is the tie's.
    assert script.lead_needed(_measure(0.5, 0, 0), _measure(0.4, 0, 0)) == 1e-4
    with pytest.raises(ValueError):  # items that do not pair up are refused, not truncated
        script.lead_needed({"recall_items": [0.1, 0.2]}, {"recall_items": [0.1, 0.2, 0.3]})


@pytest.mark.parametrize(
    "arguments, message",
    [
        ("--lams -0.1 0", "--lams must be finite numbers >= 0, got -0.1"),
        ("--lams inf 0", "--lams must be finite numbers >= 0, got inf"),
        ("--lams 0.01 0.01 0", "lists a lam twice: 0.01 0.01 0"),
        ("--lams 0.01 0.02", "--lams 0.01 0.02 leaves out {lam:g}, the lam the folder is saved"),
        ("--sequences 0", "--sequences must be 1 or more, got 0"),
        ("--items 0", "--items must be 1 or more, got 0"),
        (
            "--windows 0 96",
            "--windows must be from 1 to 251 .capacity 256 less 4 sinks and one pool slot., got 0",
        ),
        ("--windows 96 252", "--windows must be from 1 to 251 .* got 252"),
        ("--windows 96 128 96", "lists a window twice: 96 128 96"),
        ("--windows 1 2", "--windows 1 2 leaves out {window}, the window the folder is saved"),
    ],
)
def test_bad_arguments_are_refused_by_name(tmp_path, arguments, message):
    folder = copy_of_shipped_scorer(tmp_path)
    saved = saved_config(folder)
    message = message.format(window=saved.window, lam=saved.lam)
    with pytest.raises(SystemExit, match=message):
        _script().main([str(folder), *arguments.split()])


def test_text_measure_is_teacher_forced_accuracy_and_the_folder_keeps_the_rules_choice(
    tmp_path, monkeypatch
):
    script = _script()
    folder = copy_of_shipped_scorer(tmp_path)
    saved = saved_config(folder)
    # The saved setting and one other window and lam; recall measures that make the rule's
    # choice depend on the text margins measured below.
    window, lam, other_window, other_lam = saved.window, saved.lam, 128, 0.05
    assert (other_window, other_lam) != (window, lam)
    recalls = {(window, lam): 0.5, (window, other_lam): 0.4, (other_window, lam): 0.45,
               (other_window, other_lam): 0.3}  # fmt: skip

    def fixed_recall(model_path, config, groups, measure):
        assert config.capacity == saved.capacity
        return lambda scorer: recalls[config.window, config.lam]

    monkeypatch.setattr(script, "recall_selection", fixed_recall)
    script.main([str(folder), "--windows", str(window), str(other_window), "--lams", str(lam),
                 str(other_lam), "--sequences", "2", "--items", "1"])  # fmt: skip
    record = json.loads((folder / "training.json").read_text())["recency_selection"]
    # The text figures are those of an independent teacher-forced pass over the same windows.
    sequences = validation_sequences(2, per_file=1)
    assert record["text"]["sequences"] == [s.source for s in sequences]
    ids = torch.stack([s.ids for s in sequences])
    long_range = torch.stack([long_range_targets(s.ids, WINDOW) for s in sequences])[:, 1:]

    def accuracy(model) -> dict:
        correct = teacher_forced(model, ids).correct.double()
        lr = long_range.double()
        return {
            "all": correct.mean().item(),
            "long_range": (correct * lr).sum().item() / lr.sum().item(),
        }

    window_text = accuracy(kc.transform(load_embedded_model(), budget_config("window", 256)))
    assert record["text"]["window_policy"] == pytest.approx(window_text, rel=1e-9)
    measured = {(m["window"], m["lam"]): m for m in record["measured"]}
    assert sorted(measured) == sorted(recalls)
    texts = set()
    for (size, recency), recall in recalls.items():
        config = dataclasses.replace(saved, window=size, topk=256 - saved.sinks - size, lam=recency)
        model = kc.transform(load_embedded_model(), config)
        load_layers([layer.self_attn.scorer for layer in model.model.layers],
                    read_tensors(scorer_folder("memory", 256)))  # fmt: skip
        text = accuracy(model)
        texts.add(tuple(text.values()))
        assert measured[size, recency]["text"] == pytest.approx(text, rel=1e-9)
        assert measured[size, recency]["recall"] == recall
    assert len(texts) > 1  # the settings differ in what they keep
    # The rule decides from these measures; the folder holds its choice, same tensors.
    margins = {
        key: _measure(m["recall"], *m["text_margin"].values()) for key, m in measured.items()
    }
    kept = script.kept_setting(margins, (saved.window, saved.lam))
    assert record["kept"] == {"window": kept[0], "lam": kept[1]}
    chosen = saved_config(folder)
    assert (chosen.window, chosen.lam, chosen.capacity) == (*kept, saved.capacity)
    assert tensors_sha256(folder) == tensors_sha256(scorer_folder("memory", 256))
    shipped = json.loads((scorer_folder("memory", 256) / "training.json").read_text())
    earlier = {k: v for k, v in shipped.items() if k in ("recency_selection", "lam_selection")}
    assert earlier and record["replaces"] == earlier
