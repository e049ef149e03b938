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


def test_the_set_with_most_recall_among_those_that_keep_windows_text_else_the_saved_one():
    kept = _script().kept_heads
    saved = _measure(0.5, -0.01, 0.0)
    measured = {(): _measure(0.9, -0.01, -0.05), ((1, 1),): _measure(0.1, 0.0, 0.001),
                ((0, 0),): _measure(0.85, -0.001, 0.0),
                ((0, 0), (1, 1)): _measure(0.3, 0.002, 0.0)}  # fmt: skip
    assert kept(measured, saved) == ((0, 0), (1, 1))
    # A long-range margin below 0 disqualifies however high the recall.
    measured[(0, 0), (1, 1)] = _measure(0.3, 0.002, -1e-6)
    assert kept(measured, saved) == ((1, 1),)
    # The saved configuration, where it keeps window's text, wins on more recall and on a tie.
    assert kept(measured, _measure(0.2, 0.0, 0.0)) is None
    assert kept(measured, _measure(0.1, 0.0, 0.0)) is None
    assert kept(measured, _measure(0.09, 0.0, 0.0)) == ((1, 1),)
    # No candidate keeps window's text: the saved configuration stays.
    assert kept({(): _measure(0.9, -0.1, 0.0)}, _measure(0.5, -0.2, 0.0)) is None
    with pytest.raises(ValueError, match=r"non-finite recall measure with streaming heads "
                                         r"\[\(\(0, 0\),\)\]"):  # fmt: skip
        kept({(): _measure(0.9, 0, 0), ((0, 0),): _measure(float("nan"), 0, 0)}, saved)
    with pytest.raises(ValueError, match=r"non-finite recall measure with streaming heads saved"):
        kept({(): _measure(0.9, 0, 0)}, _measure(float("inf"), 0, 0))


@pytest.mark.parametrize(
    "arguments, message",
    [
        (
            "--window 0",
            r"--window must be from 1 to 251 \(capacity 256 less 4 sinks and one pool "
            r"slot\), got 0",
        ),  # fmt: skip
        ("--window 252", "--window must be from 1 to 251 .* got 252"),
        ("--window 96 --lam 0", r"--lam: streaming heads need lam > 0 in float32 .*got lam=0.0"),
        ("--window 96 --lam 1e-50", r"need lam > 0 in float32 .*got lam=1e-50"),
        ("--window 96 --lam nan", r"need lam > 0 in float32 .*got lam=nan"),
        ("--window 96 --sequences 0", "--sequences must be 1 or more, got 0"),
        ("--window 96 --items 0", "--items must be 1 or more, got 0"),
    ],
)
def test_bad_arguments_are_refused_by_name(tmp_path, arguments, message):
    folder = copy_of_shipped_scorer(tmp_path)
    with pytest.raises(SystemExit, match=message):
        _script().main([str(folder), *arguments.split()])


def _fake_recall(penalty_31: float):
    """A recall measure (``answer_probability``'s signature) that falls with each streaming
    head, by ``penalty_31`` more with (3, 1), and by a little more the deeper the layer, so that
    the order and the rule's choice depend on which heads are streaming (a little more for head
    1 than head 0, so that no two heads tie)."""

    def recall(model, items, protocol, batch):
        return [_closed_form(streaming_heads(model), penalty_31)] * len(items)

    return recall


def _closed_form(heads, penalty_31: float) -> float:
    heads = [tuple(h) for h in heads]
    return (
        0.9
        - 0.01 * len(heads)
        - penalty_31 * ((3, 1) in heads)
        - sum(0.001 * layer + 0.0001 * head for layer, head in heads)
    )


def _run(script, folder, monkeypatch, penalty_31: float, *extra: str) -> dict:
    monkeypatch.setitem(script.SELECT_MEASURES, "probability", _fake_recall(penalty_31))
    script.main([str(folder), "--window", "96", "--lam", "2e-6", "--sequences", "1",
                 "--items", "1", *extra])  # fmt: skip
    return json.loads((folder / "training.json").read_text())["streaming_selection"]


def _text_kept_by_streaming_31(model, ids, long_range) -> dict:
    """A text measure by which the window policy and the sets that stream (3, 1) keep window's
    text and every other configuration loses it."""
    keeps = model.kvpop_config.scorer == "window" or (3, 1) in streaming_heads(model)
    return {"all": 0.5, "long_range": 0.5} if keeps else {"all": 0.4, "long_range": 0.4}


def test_every_set_is_measured_and_the_folder_keeps_the_rules_choice(tmp_path, monkeypatch):
    script = _script()
    folder = copy_of_shipped_scorer(tmp_path)
    saved = saved_config(folder)
    monkeypatch.setattr(script, "text_accuracy", _text_kept_by_streaming_31)
    record = _run(script, folder, monkeypatch, 0.0)
    measured = {tuple(tuple(h) for h in m["streaming_heads"]): m for m in record["measured"]}
    every = tuple((layer, head) for layer in range(4) for head in range(2))
    assert len(measured) == 1 + 8 + 7 and () in measured and every in measured
    # Each set was measured with exactly its heads streaming (the fake measure reads them).
    for heads, m in measured.items():
        assert m["recall"] == pytest.approx(_closed_form(heads, 0.0), abs=1e-12), heads
    # The recall falls with the layer and the head, so the order is by layer, then head.
    assert [tuple(h) for h in record["order"]] == list(every)
    for k in range(2, 9):
        assert tuple(every[:k]) in measured
    # The saved configuration (no streaming head) was measured with its own window and lam.
    assert (record["saved"]["window"], record["saved"]["lam"]) == (saved.window, saved.lam)
    assert record["saved"]["text_margin"] == {"all": pytest.approx(-0.1), "long_range":
                                              pytest.approx(-0.1)}  # fmt: skip
    # Of the candidates, only (3, 1) alone keeps window's text (every head's set does too but is no
    # candidate: it is the window policy).
    assert [tuple(h) for h in record["kept"]] == [(3, 1)]
    chosen = saved_config(folder)
    assert (chosen.window, chosen.topk, chosen.lam) == (96, 256 - 4 - 96, 2e-6)
    model = kc.load_scorer(kc.transform(load_embedded_model(), chosen), folder)
    assert streaming_heads(model) == [(3, 1)]
    # Only the kept head's readout changed.
    before, after = read_tensors(scorer_folder("memory", 256)), read_tensors(folder)
    for name in before:
        layer = int(name.split(".")[1])
        for head in range(before[name].shape[0]):
            zeroed = (layer, head) == (3, 1) and name.endswith(("readout.w2", "readout.b2"))
            want = 0 * before[name][head] if zeroed else before[name][head]
            assert after[name][head].equal(want), (name, head)
    shipped = json.loads((scorer_folder("memory", 256) / "training.json").read_text())
    assert record["replaces"] == {"recency_selection": shipped["recency_selection"]}
    with pytest.raises(SystemExit, match=r"memory-256 already has streaming heads \[\(3, 1\)\]"):
        script.main([str(folder), "--window", "96", "--sequences", "1", "--items", "1"])


def test_the_saved_configuration_stays_where_no_set_keeps_windows_text(tmp_path, monkeypatch):
    script = _script()
    folder = copy_of_shipped_scorer(tmp_path)
    before = (saved_config(folder), read_tensors(folder))
    # Real text on one validation window: every head streaming keeps exactly what the window
    # policy keeps (the run checks the margin is 0), and on this window no candidate keeps
    # window's text, so the folder keeps its configuration and tensors.
    record = _run(script, folder, monkeypatch, 0.9)
    measured = {tuple(tuple(h) for h in m["streaming_heads"]): m for m in record["measured"]}
    every = tuple((layer, head) for layer in range(4) for head in range(2))
    assert measured[every]["text_margin"] == {"all": 0.0, "long_range": 0.0}
    candidates = [m for h, m in measured.items() if h != every] + [record["saved"]]
    assert all(min(m["text_margin"].values()) < 0 for m in candidates)
    assert record["kept"] is None
    assert saved_config(folder) == before[0]
    after = read_tensors(folder)
    assert all(after[name].equal(tensor) for name, tensor in before[1].items())
