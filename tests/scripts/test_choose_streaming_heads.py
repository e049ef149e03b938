"""``scripts/choose_streaming_heads.py``: a saved scorer's streaming heads chosen on validation
text and recall."""

import json

import pytest
from script_support import copy_of_shipped_scorer, load_script

import kvpop_compile as kc
from kvpop_compile.embedded import load_embedded_model
from kvpop_compile.evaluation.methods import scorer_folder
from kvpop_compile.scorer_io import read_tensors, saved_config
from kvpop_compile.streaming_heads import streaming_heads


def _script():
    return load_script("scripts/choose_streaming_heads.py")


def _measure(recall: float, margin_all: float, margin_long: float) -> dict:
    return {"recall": recall, "text_margin": {"all": margin_all, "long_range": margin_long}}


def test_heads_are_added_in_the_order_recall_needs_them_least():
    order = _script().prefix_order
    singles = {
        ((0, 0),): _measure(0.2, 0.0, 0.0),
        ((0, 1),): _measure(0.5, -0.1, 0.0),
        ((1, 0),): _measure(0.5, 0.0, -0.01),
        ((1, 1),): _measure(0.5, 0.0, -0.01),
    }
    # Highest recall first; among equals the better worse-of-two text margin, then (layer, head).
    assert order(singles) == [(1, 0), (1, 1), (0, 1), (0, 0)]


def test_the_set_with_most_recall_among_those_that_keep_windows_text():
    kept = _script().kept_heads
    measured = {(): _measure(0.9, -0.01, -0.05), ((1, 1),): _measure(0.1, 0.0, 0.001),
                ((0, 0),): _measure(0.85, -0.001, 0.0),
                ((0, 0), (1, 1)): _measure(0.3, 0.002, 0.0)}  # fmt: skip
    assert kept(measured) == ((0, 0), (1, 1))
    # A long-range margin below 0 disqualifies however high the recall.
    measured[(0, 0), (1, 1)] = _measure(0.3, 0.002, -1e-6)
    assert kept(measured) == ((1, 1),)
    with pytest.raises(ValueError, match=r"non-finite recall measure with streaming heads "
                                         r"\[\(\(0, 0\),\)\]"):  # fmt: skip
        kept({(): _measure(0.9, 0, 0), ((0, 0),): _measure(float("nan"), 0, 0)})
    with pytest.raises(ValueError, match="no measured set keeps the window policy's text"):
        kept({(): _measure(0.9, -0.1, 0)})


@pytest.mark.parametrize(
    "arguments, message",
    [
        (
            "--window 0",
            r"--window must be from 1 to 251 \(capacity 256 less 4 sinks and one pool "
            r"slot\), got 0",
        ),  # fmt: skip
        ("--window 252", "--window must be from 1 to 251 .* got 252"),
        ("--window 96 --lam 0", "--lam must be a finite number > 0, got 0.0"),
        ("--window 96 --lam nan", "--lam must be a finite number > 0, got nan"),
        ("--window 96 --sequences 0", "--sequences must be 1 or more, got 0"),
        ("--window 96 --items 0", "--items must be 1 or more, got 0"),
    ],
)
def test_bad_arguments_are_refused_by_name(tmp_path, arguments, message):
    folder = copy_of_shipped_scorer(tmp_path)
    with pytest.raises(SystemExit, match=message):
        _script().main([str(folder), *arguments.split()])


def test_the_folder_keeps_the_rules_choice_and_a_second_choice_is_refused(tmp_path, monkeypatch):
    script = _script()
    folder = copy_of_shipped_scorer(tmp_path)
    saved = saved_config(folder)

    def recall(model, items, protocol, batch):
        # A recall measure that falls with each streaming head, most with (3, 1)'s, so that
        # the order and the rule's choice depend on which heads are streaming.
        heads = streaming_heads(model)
        value = 0.9 - 0.01 * len(heads) - 0.5 * ((3, 1) in heads) - 0.001 * sum(h for h, _ in heads)
        return [value] * len(items)

    monkeypatch.setitem(script.SELECT_MEASURES, "probability", recall)
    script.main([str(folder), "--window", "96", "--lam", "2e-6", "--sequences", "1",
                 "--items", "1"])  # fmt: skip
    record = json.loads((folder / "training.json").read_text())["streaming_selection"]
    measured = {tuple(tuple(h) for h in m["streaming_heads"]): m for m in record["measured"]}
    every = tuple((layer, head) for layer in range(4) for head in range(2))
    assert len(measured) == 1 + 8 + 7 and () in measured and every in measured
    assert measured[every]["text_margin"] == {"all": 0.0, "long_range": 0.0}
    singles = {heads: m for heads, m in measured.items() if len(heads) == 1}
    assert [tuple(h) for h in record["order"]] == script.prefix_order(singles)
    assert record["order"][-1] == [3, 1]  # the head recall needs most comes last
    for k in range(2, 9):  # every prefix of that order was measured
        assert tuple(sorted(tuple(h) for h in record["order"][:k])) in measured
    kept = script.kept_heads(measured)
    assert [tuple(h) for h in record["kept"]] == list(kept)
    chosen = saved_config(folder)
    assert (chosen.window, chosen.topk, chosen.lam) == (96, 256 - 4 - 96, 2e-6)
    model = kc.load_scorer(kc.transform(load_embedded_model(), chosen), folder)
    assert streaming_heads(model) == list(kept)
    # Only the kept heads' readouts changed.
    before, after = read_tensors(scorer_folder("memory", 256)), read_tensors(folder)
    changed = {name for name in before if not before[name].equal(after[name])}
    layers = {layer for layer, _ in kept}
    assert changed <= {f"layers.{layer}.readout.{w}" for layer in layers for w in ("w2", "b2")}
    for layer in layers:
        for w in ("w2", "b2"):
            name = f"layers.{layer}.readout.{w}"
            for head in range(2):
                expected = 0 * before[name][head] if (layer, head) in kept else before[name][head]
                assert after[name][head].equal(expected), (name, head)
    shipped = json.loads((scorer_folder("memory", 256) / "training.json").read_text())
    assert record["replaces"] == {"recency_selection": shipped["recency_selection"]}
    assert record["saved_before"] == {"window": saved.window, "lam": saved.lam}
    # At window 96 the learned heads keep less of the sequence's text than the window policy
    # (the base set is not eligible), so some heads were made streaming; a second choice on
    # the rewritten folder would measure a scorer that is no longer the trained one.
    assert kept and min(measured[()]["text_margin"].values()) < 0
    with pytest.raises(
        SystemExit, match=r"memory-256 already has streaming heads \[\(.*\(3, 1\)\]: choose them on"
    ):
        script.main([str(folder), "--window", "96", "--sequences", "1", "--items", "1"])
