"""``scripts/choose_scorer_tensors.py``: a saved scorer's tensors against a new run's, at the
saved budget, on validation text and on recall asked in both protocols."""

import json
import shutil

import pytest
import torch
from script_support import load_script

from kvpop_compile.evaluation.methods import scorer_folder
from kvpop_compile.scorer_io import read_tensors, saved_config, tensors_sha256


def _script():
    return load_script("scripts/choose_scorer_tensors.py")


def _copy(tmp_path, policy: str, capacity: int, name: str):
    folder = tmp_path / name
    shutil.copytree(scorer_folder(policy, capacity), folder)
    return folder


def _fingerprint(model) -> float:
    """A number that tells the scorers' tensors apart: the sum of layer 0's first readout
    matrix, whichever kind of scorer holds it."""
    scorer = model.model.layers[0].self_attn.scorer
    readout = scorer.readout if hasattr(scorer, "readout") else scorer.mlp
    return float(readout.w1.detach().double().sum())


def _measures(monkeypatch, script, recall_of, text_of, asked: list):
    """Fake measures: recall per item from ``recall_of(fingerprint, index)`` (``index``: the
    item's place among all items a model is asked, in the order asked), text from
    ``text_of(fingerprint)`` (the window policy, which has no scorer, keeps 0.5 / 0.5); every
    recall call is noted in ``asked`` as (protocol, stretch, item lengths)."""
    counts: dict[float, int] = {}

    def recall(model, items, protocol, stretch=0, batch=None):
        asked.append((protocol, stretch, {i.context_length for i in items}))
        mark = _fingerprint(model)
        first = counts.get(mark, 0)
        counts[mark] = first + len(items)
        return [recall_of(mark, first + n) for n in range(len(items))]

    def text(model, ids, long_range):
        if model.model.layers[0].self_attn.kvpop_config.scorer.value == "window":
            return {"all": 0.5, "long_range": 0.5}
        return text_of(_fingerprint(model))

    monkeypatch.setitem(script.SELECT_MEASURES, "probability", recall)
    monkeypatch.setattr(script, "text_accuracy", text)


def test_a_candidate_that_recalls_more_and_keeps_windows_text_replaces_the_tensors(
    tmp_path, monkeypatch
):
    script = _script()
    folder = _copy(tmp_path, "memory", 256, "memory-256")
    candidate = _copy(tmp_path, "memory", 512, "candidate")  # other tensors of the same kind
    saved = saved_config(folder)
    theirs = _fingerprint(script.scored(saved, folder, candidate, None))
    asked = []
    _measures(monkeypatch, script, lambda f, n: 0.3 + 0.01 * (f == theirs),
              lambda f: {"all": 0.5, "long_range": 0.5}, asked)  # fmt: skip
    script.main([str(folder), "--candidate", str(candidate), "--sequences", "1", "--items", "1",
                 "--decode-items", "1"])  # fmt: skip
    # Six prefill groups of 2048-byte items and six decode groups of 1024-byte items asked
    # after a stretch filling the model's 2048 positions, for each tensors.
    assert asked == 2 * ([("prefill", 0, {2048})] * 6 + [("decode", 1024, {1024})] * 6)
    record = json.loads((folder / "training.json").read_text())["tensor_selection"]
    assert record["kept"] == "candidate"
    assert record["lead"] == pytest.approx(0.01) and record["lead_needed"] == pytest.approx(1e-4)
    assert [m["tensors"] for m in record["measured"]] == ["saved", "candidate"]
    assert record["measured"][1]["tensors_sha256"] == tensors_sha256(candidate)
    # Each entry says how its tensors were trained, from its own folder's record.
    sources = (scorer_folder("memory", 256), candidate)
    for entry, source in zip(record["measured"], sources, strict=True):
        trained = json.loads((source / "training.json").read_text())
        assert entry["recipe"] == {"command": trained["command"], "target": trained["target"]}
    assert record["measured"][0]["recipe"] != record["measured"][1]["recipe"]
    assert record["decode"]["length"] == 1024 and record["decode"]["items_per_task"] == 1
    assert saved_config(folder) == saved  # the budget, lam and span stay
    assert tensors_sha256(folder) == tensors_sha256(candidate)
    assert "layer_budget_selection" in json.loads((folder / "training.json").read_text())


def test_the_saved_tensors_stay_unless_the_candidate_keeps_windows_text_and_leads_past_noise(
    tmp_path, monkeypatch
):
    script = _script()
    folder = _copy(tmp_path, "memory", 256, "memory-256")
    candidate = _copy(tmp_path, "memory", 512, "candidate")
    before = tensors_sha256(folder)
    theirs = _fingerprint(script.scored(saved_config(folder), folder, candidate, None))
    # Recalls far more, but gives up long-range text to window.
    _measures(monkeypatch, script, lambda f, n: 0.3 + 0.2 * (f == theirs),
              lambda f: {"all": 0.5, "long_range": 0.5 - 0.01 * (f == theirs)}, [])  # fmt: skip
    arguments = [str(folder), "--candidate", str(candidate), "--sequences", "1", "--items", "1",
                 "--decode-items", "1"]  # fmt: skip
    script.main(arguments)
    assert json.loads((folder / "training.json").read_text())["tensor_selection"]["kept"] == "saved"
    assert tensors_sha256(folder) == before
    # Keeps text, leads on average, but by less than twice the standard error of the per-item
    # differences (+0.1 on one item in two, -0.05 on the other).
    _measures(monkeypatch, script, lambda f, n: 0.3 + (0.1 if n % 2 else -0.05) * (f == theirs),
              lambda f: {"all": 0.5, "long_range": 0.5}, [])  # fmt: skip
    script.main(arguments)
    record = json.loads((folder / "training.json").read_text())["tensor_selection"]
    assert record["lead"] > 0 and record["lead"] <= record["lead_needed"]
    assert record["kept"] == "saved" and tensors_sha256(folder) == before
    assert record["replaces"]["kept"] == "saved"  # the earlier record, kept under replaces


def test_an_mlp_candidate_goes_into_a_memory_folder_with_its_memory_read_at_zero(
    tmp_path, monkeypatch
):
    script = _script()
    folder = _copy(tmp_path, "memory", 512, "memory-512")
    candidate = _copy(tmp_path, "mlp", 256, "candidate")
    _measures(monkeypatch, script, lambda f, n: 0.9, lambda f: {"all": 0.5, "long_range": 0.5},
              [])  # fmt: skip
    # Tie on recall: the saved tensors stay; then a candidate that leads replaces them.
    script.main([str(folder), "--candidate", str(candidate), "--sequences", "1", "--items", "1",
                 "--decode-items", "0"])  # fmt: skip
    assert json.loads((folder / "training.json").read_text())["tensor_selection"]["kept"] == "saved"
    theirs = _fingerprint(script.scored(saved_config(folder), folder, candidate, None))
    _measures(monkeypatch, script, lambda f, n: 0.3 + 0.01 * (f == theirs),
              lambda f: {"all": 0.5, "long_range": 0.5}, [])  # fmt: skip
    script.main([str(folder), "--candidate", str(candidate), "--sequences", "1", "--items", "1",
                 "--decode-items", "0"])  # fmt: skip
    saved, mlp = read_tensors(folder), read_tensors(candidate)
    for layer in range(4):
        w1 = saved[f"layers.{layer}.readout.w1"]  # (H, 2D + dv, hidden)
        features = mlp[f"layers.{layer}.mlp.w1"].shape[1]
        assert torch.equal(w1[:, :features], mlp[f"layers.{layer}.mlp.w1"])
        assert not w1[:, features:].any()  # the memory read counts for nothing
        for name in ("b1", "w2", "b2"):
            assert torch.equal(saved[f"layers.{layer}.readout.{name}"],
                               mlp[f"layers.{layer}.mlp.{name}"])  # fmt: skip
    assert saved_config(folder).scorer.value == "memory"


def test_a_candidate_that_cannot_stand_for_the_folders_kind_is_refused_by_name(tmp_path):
    folder = _copy(tmp_path, "mlp", 256, "mlp-256")
    candidate = _copy(tmp_path, "memory", 256, "candidate")
    with pytest.raises(
        SystemExit,
        match=r"--candidate .*candidate: init_from .* holds a 'memory'"
        r" scorer; a 'mlp' scorer can start from a saved mlp",
    ):
        _script().main([str(folder), "--candidate", str(candidate)])
    with pytest.raises(SystemExit, match="--decode-items must be 0 or more, got -1"):
        _script().main([str(folder), "--candidate", str(candidate), "--decode-items", "-1"])


@pytest.mark.parametrize(
    "saved_margin, candidate_margin, candidate_recall, kept",
    [
        (
            -0.01,
            0.0,
            0.1,
            "saved",
        ),  # the saved tensors miss window's text; the candidate recalls less
        (-0.01, -0.001, 0.9, "saved"),  # both miss it: the candidate has not earned its place
        (0.01, -0.001, 0.9, "saved"),  # recalls more, gives up text
        (-0.01, 0.0, 0.31, "candidate"),  # keeps text exactly and leads past the tie
        (0.01, 0.02, 0.30005, "saved"),  # a lead inside the tie
    ],
)
def test_the_candidate_needs_windows_text_and_a_lead_whatever_the_saved_tensors_keep(
    saved_margin, candidate_margin, candidate_recall, kept
):
    def measure(recall, margin):
        return {"recall": recall, "text_margin": {"all": 0.0, "long_range": margin}}

    measured = {"saved": measure(0.3, saved_margin),
                "candidate": measure(candidate_recall, candidate_margin)}  # fmt: skip
    assert _script().kept_tensors(measured) == kept
