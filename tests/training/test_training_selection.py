"""Starting a run from a saved scorer (``init_from``) and keeping its best candidate by a
caller's measure (``select``)."""

import dataclasses

import pytest
import torch
from tiny_models import tiny_qwen3
from training_support import CONFIG, TEXTS, run

import kvpop_compile as kc
from kvpop_compile.config import ScorerKind
from kvpop_compile.embedded.recall import TASKS, recall_items
from kvpop_compile.embedded.recall_syntax import family_names
from kvpop_compile.runtime import build_scorer
from kvpop_compile.scorer_io import layer_tensors, read_tensors, tensors_sha256
from kvpop_compile.training import train_scorer
from kvpop_compile.training.selection import CandidateSelection, recall_selection_items
from kvpop_compile.training.warm_start import warm_start

MLP_CONFIG = dataclasses.replace(CONFIG, scorer="mlp")


def _scorers(config, model):
    attention = model.model.layers[0].self_attn
    return [
        build_scorer(config, model.config.num_key_value_heads, attention.head_dim)
        for _ in model.model.layers
    ]


def _train_mlp(folder, steps=3):
    settings = kc.TrainSettings(steps=steps, seq_len=96, batch_size=2, eval_every=5, lr=3e-3)
    report = train_scorer(tiny_qwen3(), TEXTS, MLP_CONFIG, settings, output_dir=folder,
                          progress=False)  # fmt: skip
    return report.scorer_path


def test_a_memory_scorer_started_from_an_mlp_scores_exactly_as_that_mlp(tmp_path):
    mlp_folder = _train_mlp(tmp_path / "mlp")
    model = tiny_qwen3()
    mlps = _scorers(MLP_CONFIG, model)
    memories = _scorers(CONFIG, model)
    warm_start(mlps, ScorerKind.MLP, mlp_folder)
    warm_start(memories, ScorerKind.MEMORY, mlp_folder)
    heads, dim = mlps[0].num_kv_heads, mlps[0].head_dim
    k, v = torch.randn(2, heads, 40, dim), torch.randn(2, heads, 40, dim)
    window = CONFIG.window
    for mlp, memory in zip(mlps, memories, strict=True):
        want, _ = mlp.score_sequence(k, v, window)
        got, _ = memory.score_sequence(k, v, window)
        # The memory scorer scores a token when it leaves the window: the last W have none yet.
        torch.testing.assert_close(got[..., :-window], want[..., :-window])
        # The memory's read is there, with zero weight, so training can give it one.
        assert memory.readout.w1[:, 2 * dim :].abs().sum() == 0


def test_init_from_starts_the_run_at_the_saved_scorer_and_trains_on(tmp_path):
    start = run(tmp_path / "first", 3).scorer_path
    seen = []

    def select(folder):
        seen.append(read_tensors(folder))
        return 0.0

    report = run(tmp_path / "second", 2, eval_every=2, init_from=start, select=select)
    saved = read_tensors(start)
    assert seen[0].keys() == saved.keys()
    assert all(torch.equal(seen[0][name], saved[name]) for name in saved)  # step 0 = the start
    assert any(not torch.equal(seen[1][name], saved[name]) for name in saved)  # it trained
    checkpoint = torch.load(tmp_path / "second" / "checkpoint.pt", weights_only=False)
    # Recorded by content, so a resume from a retrained starting point is refused.
    assert checkpoint["settings"]["init_from_sha256"] == tensors_sha256(start)
    assert report.selected_step == 2  # a tie goes to the later step


def test_bad_starting_points_are_refused(tmp_path):
    memory_folder = run(tmp_path / "memory", 2).scorer_path
    model = tiny_qwen3()
    with pytest.raises(ValueError, match="holds a 'memory' scorer; a 'mlp' scorer can start "
                       "from a saved mlp scorer"):  # fmt: skip
        warm_start(_scorers(MLP_CONFIG, model), ScorerKind.MLP, memory_folder)
    # Checked before the data is read: an empty data folder is not what is reported.
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds a 'memory' scorer"):
        settings = kc.TrainSettings(init_from=memory_folder)
        train_scorer(tiny_qwen3(), tmp_path / "empty", MLP_CONFIG, settings, output_dir=tmp_path)
    narrow = dataclasses.replace(CONFIG, scorer_hidden=8)
    with pytest.raises(ValueError, match="init_from .*: scorer mismatch in layer 0: readout.b1"):
        warm_start(_scorers(narrow, model), ScorerKind.MEMORY, memory_folder)
    with pytest.raises(ValueError, match="init_from .*: layer 0's mlp.w1 has shape .* needs"):
        warm_start(_scorers(narrow, model), ScorerKind.MEMORY, _train_mlp(tmp_path / "mlp", 1))
    with pytest.raises(ValueError, match="init_from .*: saved for num_layers=2, the model has 1"):
        warm_start(_scorers(CONFIG, model)[:1], ScorerKind.MEMORY, memory_folder)
    with pytest.raises(FileNotFoundError, match="not a saved KVpop scorer folder"):
        warm_start(_scorers(CONFIG, model), ScorerKind.MEMORY, tmp_path)
    with pytest.raises(ValueError, match="init_from must be a saved scorer folder .* got 3"):
        kc.TrainSettings(init_from=3)


def test_select_keeps_the_best_candidate_and_survives_a_resume(tmp_path):
    measures = {0: 0.1, 2: 0.9, 3: 0.2, 4: 0.5, 6: 0.3}

    def select(folder):
        return measures[int(folder.name.removeprefix("step-"))]

    first = run(tmp_path, 3, eval_every=2, select=select)
    assert [m["step"] for m in first.selections] == [0, 2, 3]
    resumed = run(tmp_path, 6, eval_every=2, select=select)
    assert [(m["step"], m["select"]) for m in resumed.selections] == [
        (0, 0.1), (2, 0.9), (3, 0.2), (4, 0.5), (6, 0.3)
    ]  # fmt: skip
    assert resumed.selected_step == 2
    best = read_tensors(tmp_path / "candidates" / "step-000002")
    kept = read_tensors(resumed.scorer_path)
    assert all(torch.equal(best[name], kept[name]) for name in best)
    last = read_tensors(tmp_path / "candidates" / "step-000006")
    assert any(not torch.equal(last[name], kept[name]) for name in last)
    # The saved scorer loads like any other.
    kc.load_scorer(kc.transform(tiny_qwen3(), CONFIG), resumed.scorer_path)


def test_an_interrupted_run_keeps_what_an_uninterrupted_one_keeps(tmp_path):
    measures = {0: 0.2, 2: 0.4, 4: 0.9, 6: 0.1}
    cut = []

    def select(folder):
        step = int(folder.name.removeprefix("step-"))
        if step == 4 and folder.parts[-3] == "cut" and not cut:
            cut.append(step)
            raise KeyboardInterrupt  # the run is cut off after its checkpoint at step 3
        return measures[step]

    settings = dict(eval_every=2, checkpoint_every=3, select=select)
    straight = run(tmp_path / "straight", 6, **settings)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "cut", 6, **settings)
    resumed = run(tmp_path / "cut", 6, **settings)
    assert resumed.selections == straight.selections
    assert [m["step"] for m in resumed.selections] == [0, 2, 4, 6]
    assert resumed.selected_step == straight.selected_step == 4
    a = (straight.scorer_path / "scorer.safetensors").read_bytes()
    b = (resumed.scorer_path / "scorer.safetensors").read_bytes()
    assert a == b


def test_a_resume_that_changes_selection_is_refused(tmp_path):
    run(tmp_path / "a", 3, select=lambda folder: 1.0)
    with pytest.raises(ValueError, match="made with other settings \\(select\\)"):
        run(tmp_path / "a", 6)
    run(tmp_path / "b", 3)
    with pytest.raises(ValueError, match="made with other settings \\(select\\)"):
        run(tmp_path / "b", 6, select=lambda folder: 1.0)


def test_a_measure_may_be_any_real_number_but_a_finite_one():
    import numpy as np

    from kvpop_compile.training.selection import _as_measure

    for value, want in ((np.float32(0.5), 0.5), (torch.tensor(0.25), 0.25), (3, 3.0)):
        assert _as_measure(value, "f") == want
    for bad in (True, "0.5", torch.ones(2), float("inf")):
        with pytest.raises(ValueError, match="select must return a finite number"):
            _as_measure(bad, "f")


def test_a_measure_that_is_not_a_finite_number_is_refused(tmp_path):
    with pytest.raises(ValueError, match="select must return a finite number, got nan"):
        run(tmp_path / "a", 2, select=lambda folder: float("nan"))
    with pytest.raises(TypeError, match="select must be callable"):
        run(tmp_path / "b", 2, select=0.5)
    with pytest.raises(ValueError, match="works with mode='scorer', not 'distill'"):
        run(tmp_path / "c", 2, select=lambda folder: 1.0, mode="distill")
    selection = CandidateSelection(lambda folder: 1.0, tmp_path)
    selection.measured = [{"step": 0, "select": 1.0}, {"step": 5, "select": 1.0}]
    assert selection.best_step() == 5
    layer = layer_tensors({"layers.1.w": torch.ones(1), "layers.10.w": torch.zeros(1)}, 1)
    assert list(layer) == ["w"] and torch.equal(layer["w"], torch.ones(1))


def test_a_finished_run_is_chosen_again_by_another_measure(tmp_path):
    first = run(tmp_path, 4, eval_every=2, select=lambda folder: 1.0)
    assert first.selected_step == 4  # all tie: the last
    other = {0: 0.3, 2: 0.8, 4: 0.1}
    seen = []

    def select(folder):
        seen.append(folder.name)
        return other[int(folder.name.removeprefix("step-"))]

    selection = CandidateSelection(select, tmp_path)
    steps = [m["step"] for m in first.selections]
    measured = selection.measure_saved(steps)
    assert [(m["step"], m["select"]) for m in measured] == [(0, 0.3), (2, 0.8), (4, 0.1)]
    assert seen == ["step-000000", "step-000002", "step-000004"]  # each once, in step order
    assert selection.best_step() == 2
    with pytest.raises(FileNotFoundError, match="no candidate is saved under .* steps \\[6\\]"):
        selection.measure_saved([4, 6])
    with pytest.raises(ValueError, match="no step to measure"):
        selection.measure_saved([])
    with pytest.raises(ValueError, match="select must return a finite number, got nan"):
        CandidateSelection(lambda folder: float("nan"), tmp_path).measure_saved(steps)


@pytest.mark.parametrize("split", ["validation", "train"])
def test_recall_selection_items_ask_trained_and_validation_families_never_held_out_ones(split):
    groups = recall_selection_items(split, 2, 7, 1024)
    expected = [
        recall_items(split, task, 1024, 2, 7, families=families)
        for families in ("train", "validation")
        for task in TASKS
    ]
    assert groups == expected
    items = [item for group in groups for item in group]
    assert {item.families for item in items} == {"train", "validation"}
    held_out = set(family_names("held_out"))
    # Training items are in named or generated training families.
    asked = set(family_names("train")) | set(family_names("validation")) | {"generated"}
    assert all(item.family in asked and item.family not in held_out for item in items)
    assert all(item.families == "train" for item in items if item.family == "generated")


def test_recall_selection_items_refuse_held_out_code():
    with pytest.raises(ValueError, match="split must be one of \\('validation', 'train'\\)"):
        recall_selection_items("held_out", 1, 0, 1024)
