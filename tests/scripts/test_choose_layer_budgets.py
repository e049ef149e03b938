"""``scripts/choose_layer_budgets.py``: a saved scorer's per-layer budget chosen on validation
text and recall."""

import argparse
import dataclasses
import json

import pytest
from script_support import copy_of_shipped_scorer, load_script

from kvpop_compile.scorer_io import read_tensors, saved_config


def _script():
    return load_script("scripts/choose_layer_budgets.py")


def _args(folder, **fields) -> argparse.Namespace:
    settings = {"folder": folder, "layer": 3, "others": [64, 128], "windows": [96, 192],
                "other_pool": 16, "sequences": 1, "items": 1, "threads": 1, **fields}  # fmt: skip
    return argparse.Namespace(**settings)


def test_the_candidates_share_the_saved_total_between_the_layers(tmp_path):
    folder = copy_of_shipped_scorer(tmp_path)
    saved = saved_config(folder)  # capacity 256, 4 sinks
    budgets = _script().candidates(saved, 4, _args(folder, layer=2, other_pool=10))
    assert budgets == [
        ((50, 50, 96, 50), (10, 10, 832 - 4 - 96, 10)),
        ((50, 50, 192, 50), (10, 10, 832 - 4 - 192, 10)),
        ((114, 114, 96, 114), (10, 10, 640 - 4 - 96, 10)),
        ((114, 114, 192, 114), (10, 10, 640 - 4 - 192, 10)),
    ]
    for windows, topks in budgets:
        assert sum(4 + w + k for w, k in zip(windows, topks, strict=True)) == 4 * 256


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"layer": 4}, "--layer must be from 0 to 3, got 4"),
        ({"others": [20]}, "--others 20 leaves no window: each other layer keeps 4 sinks and 16"),
        ({"windows": [0]}, r"--windows 0 must be from 1 to 827 \(layer 3 keeps 832 slots"),
        ({"windows": [636]}, r"--windows 636 must be from 1 to 635 \(layer 3 keeps 640 slots"),
        ({"other_pool": 0}, "--other-pool must be 1 or more, got 0"),
        ({"items": 0}, "--items must be 1 or more, got 0"),
        ({"windows": [96, 96]}, "--others 64 128 and --windows 96 96 list a budget twice"),
        ({"others": [64, 64]}, "--others 64 64 and --windows 96 192 list a budget twice"),
        (
            {"others": [400]},
            r"--others 400 leaves layer 3 -176 of the 1024 slots, too few for 4 "
            r"sinks, a window and a pool: give --others 339 or less",
        ),
    ],
)
def test_bad_arguments_are_refused_by_name(tmp_path, fields, message):
    folder = copy_of_shipped_scorer(tmp_path)
    with pytest.raises(SystemExit, match=message):
        _script().candidates(saved_config(folder), 4, _args(folder, **fields))


def _capacities(model) -> tuple[int, ...]:
    return tuple(layer.self_attn.kvpop_config.capacity for layer in model.model.layers)


def _recall(model, items, protocol, batch):
    """A recall measure that grows with layer 3's capacity and, a little, with its window."""
    config = model.model.layers[3].self_attn.kvpop_config
    return [config.capacity / 1000 + config.window / 1e6] * len(items)


def _text(model, ids, long_range) -> dict:
    """A text measure by which window's text is kept where every layer keeps 128 slots or
    more (the window policy keeps 256 in each)."""
    keeps = min(_capacities(model)) >= 128
    return {"all": 0.5, "long_range": 0.5} if keeps else {"all": 0.5, "long_range": 0.4}


def test_every_budget_is_measured_and_the_folder_keeps_the_rules_choice(tmp_path, monkeypatch):
    script = _script()
    folder = copy_of_shipped_scorer(tmp_path)
    saved, before = saved_config(folder), read_tensors(folder)
    monkeypatch.setattr(script, "text_accuracy", _text)
    monkeypatch.setitem(script.SELECT_MEASURES, "probability", _recall)
    script.main([str(folder), "--layer", "3", "--others", "64", "128", "192", "--windows", "96",
                 "192", "--sequences", "1", "--items", "1"])  # fmt: skip
    record = json.loads((folder / "training.json").read_text())["layer_budget_selection"]
    measured = {tuple(m["capacities"]): m for m in record["measured"][1:] if m["window"][3] == 192}
    assert sorted(measured) == [(64, 64, 64, 832), (128, 128, 128, 640), (192, 192, 192, 448)]
    assert len(record["measured"]) == 1 + 3 * 2
    # Each budget was measured at its own capacities (the fake measures read them).
    for capacities, m in measured.items():
        assert m["recall"] == pytest.approx(capacities[3] / 1000 + 192 / 1e6)
    assert record["measured"][0]["capacities"] == [256] * 4  # the saved budget first
    # 64 slots lose window's text; of the rest, 640 slots in layer 3 recall the most, and of its
    # two windows the wider.
    assert record["kept"] == {"window": [108, 108, 108, 192], "topk": [16, 16, 16, 444],
                              "lam": saved.lam}  # fmt: skip
    chosen = saved_config(folder)
    assert chosen.capacities == (128, 128, 128, 640)
    assert (chosen.lam, chosen.priority_span) == (saved.lam, saved.priority_span)
    after = read_tensors(folder)
    assert all(after[name].equal(tensor) for name, tensor in before.items())
    # The scripts that choose a scorer's one budget refuse it by name.
    others = {"choose_recency.py": [], "choose_priority_span.py": ["--spans", "10"],
              "choose_streaming_heads.py": ["--window", "96"]}  # fmt: skip
    for other, arguments in others.items():
        with pytest.raises(SystemExit, match=f"keeps a per-layer budget .*: {other} measures a "
                                             "scorer of one budget"):  # fmt: skip
            load_script(f"scripts/{other}").main([str(folder), *arguments])


def _recall_with_lam(model, items, protocol, batch):
    """``_recall``, less 100 times the recency term: the recency term costs recall."""
    config = model.model.layers[3].self_attn.kvpop_config
    return [value - 100 * config.lam for value in _recall(model, items, protocol, batch)]


def _text_with_lam(model, ids, long_range) -> dict:
    """``_text``, where layer 3 keeping more than 448 slots also needs a recency term to keep
    window's text."""
    config = model.model.layers[3].self_attn.kvpop_config
    if config.capacity > 448 and config.lam == 0:
        return {"all": 0.5, "long_range": 0.45}
    return _text(model, ids, long_range)


def test_the_recency_term_is_chosen_with_the_budget_and_a_shared_folder_chosen_again(
    tmp_path, monkeypatch
):
    script = _script()
    folder = copy_of_shipped_scorer(tmp_path)
    saved = saved_config(folder)
    assert saved.lam == 0.0005
    monkeypatch.setattr(script, "text_accuracy", _text_with_lam)
    monkeypatch.setitem(script.SELECT_MEASURES, "probability", _recall_with_lam)
    script.main([str(folder), "--layer", "3", "--others", "64", "128", "192", "--windows", "192",
                 "--lams", "0", "0.0005", "--sequences", "1", "--items", "1"])  # fmt: skip
    record = json.loads((folder / "training.json").read_text())["layer_budget_selection"]
    measured = {(tuple(m["capacities"]), m["lam"]): m["recall"] for m in record["measured"]}
    assert len(measured) == 1 + 3 * 2  # the saved setting, then every budget at both lams
    assert measured[(128, 128, 128, 640), 0.0005] == pytest.approx(0.640192 - 0.05)
    # Without the recency term layer 3 may keep 448 slots at most (0.448 recalled); with it,
    # 640 slots recall 0.590: the joint choice keeps the term where one lam alone would not.
    assert record["kept"] == {"window": [108, 108, 108, 192], "topk": [16, 16, 16, 444],
                              "lam": 0.0005}  # fmt: skip
    assert record["best_eligible"]["lead"] == pytest.approx(0.640192 - 0.05 - 0.256192 + 0.05)
    chosen = saved_config(folder)
    assert (chosen.capacities, chosen.lam) == ((128, 128, 128, 640), 0.0005)
    # Chosen again, the per-layer folder is the saved setting, measured first, and the lams
    # must hold its own; the window baseline keeps the same total evenly, 256 in every layer.
    seen = []

    def text_seen(model, ids, long_range):
        seen.append((_capacities(model), model.model.layers[0].self_attn.kvpop_config.scorer))
        return _text_with_lam(model, ids, long_range)

    monkeypatch.setattr(script, "text_accuracy", text_seen)
    with pytest.raises(SystemExit, match="--lams 0 leaves out 0.0005, the lam the folder is"):
        script.main([str(folder), "--layer", "3", "--others", "192", "--windows", "96",
                     "--lams", "0"])  # fmt: skip
    script.main([str(folder), "--layer", "3", "--others", "192", "--windows", "96", "--lams",
                 "0", "0.0005", "--sequences", "1", "--items", "1"])  # fmt: skip
    again = json.loads((folder / "training.json").read_text())["layer_budget_selection"]
    assert seen[0] == ((256,) * 4, "window") and again["capacity"] == 256
    assert [capacities for capacities, _ in seen[1:]] == [(128, 128, 128, 640)] + [
        (192, 192, 192, 448)
    ] * 2
    assert [(m["capacities"], m["lam"]) for m in again["measured"]] == [
        ([128, 128, 128, 640], 0.0005), ([192, 192, 192, 448], 0.0), ([192, 192, 192, 448], 0.0005),
    ]  # fmt: skip
    assert again["kept"]["lam"] == 0.0005 and saved_config(folder) == chosen
    assert again["replaces"]["kept"] == record["kept"]


def test_a_lead_inside_the_noise_of_the_items_keeps_the_saved_setting(tmp_path, monkeypatch):
    script = _script()
    items_seen = []

    def recall(spread):
        def per_item(model, items, protocol, batch):
            """0.3 for every item at the saved lam; at lam 0, 0.01 more on average, each item
            ``spread`` above or below that in turn."""
            if model.model.layers[3].self_attn.kvpop_config.lam > 0:
                items_seen.extend(items)
                return [0.3] * len(items)
            return [0.31 + (spread if i % 2 else -spread) for i in range(len(items))]

        return per_item

    monkeypatch.setattr(script, "text_accuracy", _text)
    for spread, kept_lam in ((0.2, 0.0005), (0.0, 0.0)):
        folder = copy_of_shipped_scorer(tmp_path / str(spread))
        items_seen.clear()
        monkeypatch.setitem(script.SELECT_MEASURES, "probability", recall(spread))
        script.main([str(folder), "--layer", "3", "--others", "128", "--windows", "192",
                     "--lams", "0", "0.0005", "--sequences", "1", "--items", "2"])  # fmt: skip
        record = json.loads((folder / "training.json").read_text())["layer_budget_selection"]
        n = len(items_seen) // 2  # the saved setting's items, and the other budget's at its lam
        assert n >= 4 and len(items_seen) == 2 * n
        best = record["best_eligible"]
        assert (best["topk"], best["lam"]) == ([16, 16, 16, 444], 0.0)
        assert best["lead"] == pytest.approx(0.01)
        # Each difference is 0.01 +/- spread: standard deviation spread * sqrt(n / (n - 1)).
        noise = 2 * spread * (n / (n - 1)) ** 0.5 / n**0.5
        assert best["lead_needed"] == pytest.approx(max(1e-4, noise))
        assert record["kept"]["lam"] == kept_lam and saved_config(folder).lam == kept_lam


def test_a_total_the_layers_cannot_share_evenly_is_refused(tmp_path):
    folder = copy_of_shipped_scorer(tmp_path, one_budget=False)
    uneven = dataclasses.replace(saved_config(folder), topk=(16, 16, 16, 350))
    with pytest.raises(SystemExit, match=r"keeps \[192, 192, 192, 450\] slots per layer, 1026 in"
                                         " all, which 4 layers cannot share evenly"):  # fmt: skip
        _script().candidates(uneven, 4, _args(folder))


def test_the_saved_budget_stays_where_no_other_keeps_windows_text(tmp_path, monkeypatch):
    script = _script()
    folder = copy_of_shipped_scorer(tmp_path)
    saved = saved_config(folder)
    monkeypatch.setattr(script, "text_accuracy", _text)
    monkeypatch.setitem(script.SELECT_MEASURES, "probability", _recall)
    script.main([str(folder), "--layer", "3", "--others", "64", "--windows", "96",
                 "--sequences", "1", "--items", "1"])  # fmt: skip
    assert saved_config(folder) == saved
    record = json.loads((folder / "training.json").read_text())["layer_budget_selection"]
    assert record["kept"] == {"window": [saved.window] * 4, "topk": [saved.topk] * 4,
                              "lam": saved.lam}  # fmt: skip
