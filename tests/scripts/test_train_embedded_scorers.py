"""``scripts/train_embedded_scorers.py``: a scorer trained at one capacity, saved for another."""

import dataclasses
import json
import platform

import pytest
import torch
from script_support import copy_of_shipped_scorer, load_script

import kvpop_compile as kc
from kvpop_compile.embedded import load_embedded_model
from kvpop_compile.embedded.recall import TASKS, recall_items
from kvpop_compile.evaluation.methods import budget_config, scorer_folder
from kvpop_compile.evaluation.recall.protocol import answer_probability
from kvpop_compile.fingerprints import items_sha256
from kvpop_compile.scorer_io import read_tensors, saved_config, tensors_sha256
from kvpop_compile.training.recall_data import stretched_sequences


def _script():
    return load_script("scripts/train_embedded_scorers.py")


def test_a_scorer_trained_at_256_is_saved_for_512_and_a_wider_window_with_the_same_weights(
    tmp_path,
):
    torch.manual_seed(0)
    common = ["--policies", "mlp", "--steps", "1", "--batch-size", "1", "--eval-sequences", "1",
              "--eval-every", "1", "--priority-span", "3",
              "--work", str(tmp_path / "work")]  # fmt: skip
    with pytest.raises(SystemExit, match="--windows gives 2 windows for 1 --capacities 512"):
        _script().main([*common, "--capacities", "512", "--windows", "256", "64"])
    _script().main([*common, "--capacities", "512", "--train-capacity", "256", "--windows",
                    "256", "--lam", "0.002", "--out", str(tmp_path / "out")])  # fmt: skip
    folder = tmp_path / "out" / "mlp-512"
    # Saved for the capacity, window and recency term it serves: eval and demo transform with
    # this config, and it was trained with the same lam (the work folder's run).
    want = budget_config("mlp", 512, priority_span=3, window=256)
    assert saved_config(folder) == dataclasses.replace(want, lam=0.002)
    assert saved_config(tmp_path / "work" / "mlp-256" / "scorer").lam == 0.002
    record = json.loads((folder / "training.json").read_text())
    assert record["lam"] == 0.002
    assert (record["capacity"], record["trained_at_capacity"], record["topk"]) == (512, 256, 252)
    assert (record["window"], record["trained_with_window"]) == (256, 64)
    # The weights are the ones trained at 256 (the work folder's scorer), and they load.
    trained = read_tensors(tmp_path / "work" / "mlp-256" / "scorer")
    saved = read_tensors(folder)
    assert trained.keys() == saved.keys()
    assert all(torch.equal(trained[k], saved[k]) for k in trained)
    model = kc.transform(load_embedded_model(), saved_config(folder))
    kc.load_scorer(model, folder)


def test_a_memory_scorer_started_from_an_mlp_is_selected_on_recall_items(tmp_path):
    mlp = scorer_folder("mlp", 256)
    common = ["--policies", "memory", "--capacities", "256", "--steps", "1", "--batch-size", "1",
              "--eval-sequences", "1", "--eval-every", "1", "--priority-span", "10",
              "--init-from", str(mlp), "--select-items", "1", "--scorer-hidden", "256",
              "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")]  # fmt: skip
    with pytest.raises(SystemExit, match="--select-seed 0 equals --seed"):
        _script().main([*common, "--select-seed", "0", "--recall-fraction", "0.5",
                        "--select-split", "train"])  # fmt: skip
    _script().main(common)
    record = json.loads((tmp_path / "out" / "memory-256" / "training.json").read_text())
    assert record["init_from"] == {"path": str(mlp), "tensors_sha256": tensors_sha256(mlp)}
    selection = record["selection"]
    assert [m["step"] for m in selection["measured"]] == [0, 1]
    # By default on validation code, in the trained and the validation families (never the
    # held-out ones): one item per family group and task.
    assert (selection["split"], selection["families"]) == ("validation", ["train", "validation"])
    groups = [recall_items("validation", task, 2048, 1, 99, families=families)
              for families in ("train", "validation") for task in TASKS]  # fmt: skip
    assert selection["items_sha256"] == items_sha256(i for group in groups for i in group)
    # Each measure is a share of the 2 * len(TASKS) answers; the best is kept.
    asked = 2 * len(TASKS)
    shares = {k / asked for k in range(asked + 1)}
    assert all(m["select"] in shares for m in selection["measured"])
    best = max(selection["measured"], key=lambda m: (m["select"], m["step"]))
    assert selection["kept_step"] == best["step"]
    candidate = read_tensors(tmp_path / "work" / "memory-256" / "candidates" /
                             f"step-{best['step']:06d}")  # fmt: skip
    saved = read_tensors(tmp_path / "out" / "memory-256")
    assert all(torch.equal(candidate[k], saved[k]) for k in saved)


def test_a_finished_run_is_chosen_again_by_another_measure(tmp_path, monkeypatch):
    module = _script()
    splits, missing = [], {"validation"}

    def items(split, per_task, seed):
        if split in missing:  # as where the test suite is not installed
            raise FileNotFoundError(f"no {split} text")
        splits.append(split)
        return [[] for _ in TASKS]

    def selection(model_path, config, groups, measure, decode_groups=()):
        split = splits[-1]  # training measures tie (the later step is kept); validation wants 0
        return lambda folder: 0.5 if split == "train" else float(folder.name == "step-000000")

    monkeypatch.setattr(module, "selection_items", items)
    monkeypatch.setattr(module, "recall_selection", selection)
    work, out = tmp_path / "work", tmp_path / "out"
    common = ["--policies", "memory", "--capacities", "256", "--steps", "1", "--batch-size", "1",
              "--eval-sequences", "1", "--eval-every", "1", "--priority-span", "10",
              "--init-from", str(scorer_folder("mlp", 256)), "--scorer-hidden", "256",
              "--work", str(work), "--out", str(out)]  # fmt: skip
    with pytest.raises(SystemExit, match="--reselect chooses by the selection measure"):
        module.main([*common, "--reselect"])
    with pytest.raises(SystemExit, match="--reselect: .* holds no run"):
        module.main([*common, "--select-items", "1", "--select-split", "train", "--reselect"])
    with pytest.raises(FileNotFoundError, match="no validation text"):
        module.main([*common, "--select-items", "1", "--select-split", "validation"])
    assert not (work / "memory-256").exists()  # stopped before it claimed the folder
    missing.clear()
    (work / "memory-256").mkdir(parents=True)  # a record without a checkpoint holds nothing
    (work / "memory-256" / "run.json").write_text('{"command": "x", "selection": null}')
    module.main([*common, "--select-items", "1", "--select-split", "train"])
    first = json.loads((out / "memory-256" / "training.json").read_text())
    assert first["selection"]["kept_step"] == 1
    assert first["selection"]["items_sha256"] == items_sha256([])
    assert first["selection"]["python"] == platform.python_version()
    with pytest.raises(SystemExit, match="holds a run selected by .*'items_per_task': 1"):
        module.main([*common, "--select-items", "2", "--select-split", "train"])  # two measures
    with pytest.raises(SystemExit, match="holds a run selected by .*'split': 'train'"):
        module.main([*common, "--select-items", "1"])  # the default split is validation
    record = work / "memory-256" / "run.json"
    kept_record = record.read_text()
    record.unlink()
    with pytest.raises(SystemExit, match="holds a run without run.json"):
        module.main([*common, "--select-items", "1", "--select-split", "train"])
    record.write_text(kept_record)
    with pytest.raises(SystemExit, match="is at step 1, not --steps 2: give the run's own"):
        module.main([*common[:-4], "--steps", "2", "--work", str(work), "--out", str(out),
                     "--select-items", "1", "--reselect"])  # fmt: skip
    candidates = work / "memory-256" / "candidates"
    saved = {p.name: p.stat().st_mtime_ns for p in candidates.iterdir()}
    reselect = [*common, "--select-items", "1", "--select-split", "validation", "--reselect"]
    module.main(reselect)
    assert splits[-1] == "validation"
    assert {p.name: p.stat().st_mtime_ns for p in candidates.iterdir()} == saved  # no training
    record = json.loads((out / "memory-256" / "training.json").read_text())
    selection = record["selection"]
    assert (selection["split"], selection["kept_step"]) == ("validation", 0)
    assert [(m["step"], m["select"]) for m in selection["measured"]] == [(0, 1.0), (1, 0.0)]
    assert selection["during_training"] == {
        "command": first["command"],
        "selection": {"split": "train", "families": ["train", "validation"],
                      "items_per_task": 1, "seed": 99},
        "measured": first["selection"]["measured"], "kept_step": 1,
    }  # fmt: skip
    assert record["command"].endswith(" ".join(reselect))
    kept, step0 = read_tensors(out / "memory-256"), read_tensors(candidates / "step-000000")
    assert all(torch.equal(kept[k], step0[k]) for k in kept)
    own, step1 = (
        read_tensors(work / "memory-256" / "scorer"),
        read_tensors(candidates / "step-000001"),
    )
    assert all(torch.equal(own[k], step1[k]) for k in own)  # the run's own choice stays


def test_each_saved_budget_is_chosen_again_on_its_own_by_answer_probability(tmp_path, monkeypatch):
    module = _script()
    measured = []  # (capacity, window, per-item measure, step) of every candidate measured

    def selection(model_path, config, groups, measure="exact", decode_groups=()):
        capacity = config.sinks + config.window + config.topk

        def select(folder):
            step = int(folder.name.removeprefix("step-"))
            measured.append((capacity, config.window, measure, step))
            return float((step == 0) == (capacity == 512))  # 512 wants step 0, 256 step 1

        return select

    monkeypatch.setattr(module, "selection_items", lambda *_: [[] for _ in TASKS])
    monkeypatch.setattr(module, "recall_selection", selection)
    work, out = tmp_path / "work", tmp_path / "out"
    common = ["--policies", "memory", "--capacities", "512", "256", "--windows", "128", "96",
              "--train-capacity", "256", "--train-window", "96", "--steps", "1",
              "--batch-size", "1", "--eval-sequences", "1", "--eval-every", "1",
              "--priority-span", "10", "--init-from", str(scorer_folder("mlp", 256)),
              "--scorer-hidden", "256", "--select-items", "1",
              "--work", str(work), "--out", str(out)]  # fmt: skip
    with pytest.raises(SystemExit, match="--select-at saved chooses among a finished run's"):
        module.main([*common, "--select-at", "saved"])
    module.main(common)
    assert measured == [(256, 96, "exact", 0), (256, 96, "exact", 1)]  # once, while training
    # Training on with another measure would mix two measures' numbers in one choice.
    with pytest.raises(SystemExit, match="holds a run selected by .* 'measure': 'probability'"):
        module.main([*common, "--select-measure", "probability"])
    measured.clear()
    module.main([*common, "--select-measure", "probability", "--select-at", "saved", "--reselect"])
    # Each saved budget measures the run's candidates at its own capacity and window.
    assert measured == [(512, 128, "probability", s) for s in (0, 1)] + [
        (256, 96, "probability", s) for s in (0, 1)
    ]
    candidates = work / "memory-256" / "candidates"
    for capacity, kept in ((512, 0), (256, 1)):
        selection = json.loads((out / f"memory-{capacity}" / "training.json").read_text())[
            "selection"
        ]
        assert (selection["measure"], selection["at"], selection["kept_step"]) == (
            "probability", "saved", kept
        )  # fmt: skip
        assert selection["during_training"]["selection"] == {
            "split": "validation", "families": ["train", "validation"], "items_per_task": 1,
            "seed": 99,
        }  # fmt: skip
        saved, candidate = (
            read_tensors(out / f"memory-{capacity}"),
            read_tensors(candidates / f"step-{kept:06d}"),
        )
        assert all(torch.equal(saved[k], candidate[k]) for k in saved)


def test_a_candidate_is_measured_at_a_window_other_than_the_one_it_was_saved_with(tmp_path):
    """--select-at saved runs a candidate saved at one window (the shipped memory-256's own, at
    its one budget) at a saved budget's (256 or 96 of 512): by tensors, as the install does, and
    the measure is the one of that budget, not of the window saved."""
    module = _script()
    folder = copy_of_shipped_scorer(tmp_path)
    shipped = saved_config(folder)
    assert shipped.window not in (96, 256)
    span = str(shipped.priority_span)  # the span it runs with, as saved
    args = module.parse_args(
        ["--priority-span", span, "--scorer-hidden", "256", "--lam", str(shipped.lam)]
    )
    groups = [recall_items("train", "lookup", 2048, 1, 99)]

    def measure(window, kind="probability", capacity=512):
        config = module.scorer_config("memory", capacity, window, args)
        return module.recall_selection(None, config, groups, kind)(folder)

    # At the window it was saved with, the measure is that of the scorer loaded as saved.
    saved = kc.load_scorer(kc.transform(load_embedded_model(), shipped), folder)
    at_saved = measure(shipped.window, capacity=256)
    assert at_saved == pytest.approx(answer_probability(saved, groups[0], "prefill")[0])
    at_256, at_96 = measure(256), measure(96)
    assert 0.0 < at_256 <= 1.0 and 0.0 < at_96 <= 1.0
    assert at_256 != at_96  # another window keeps other tokens
    assert measure(256, "exact") in (0.0, 1.0)


def test_a_scorer_trained_at_a_per_layer_budget_is_saved_at_it(tmp_path):
    windows, topks = ["40", "40", "40", "96"], ["16", "16", "16", "232"]  # capacities average 128
    common = ["--policies", "mlp", "--steps", "1", "--batch-size", "1", "--eval-sequences", "1",
              "--eval-every", "1", "--priority-span", "3", "--lam", "0.001",
              "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")]  # fmt: skip
    layers = ["--layer-windows", *windows, "--layer-topks", *topks]
    refusals = [
        (["--capacities", "128", "--layer-windows", *windows], "needs both"),
        (["--capacities", "128", *layers[:-1]], "lists 4 layers and --layer-topks 3"),
        (["--capacities", "128", "--train-capacity", "128", *layers], "--train-capacity"),
        (["--capacities", "128", "--windows", "40", *layers], "--windows set a one-budget"),
        (["--capacities", "128", "--train-capacity=128", *layers], "--train-capacity set"),
        (["--capacities", "128", "--train-window", "64", *layers], "--train-window set"),
        (
            [
                "--capacities",
                "128",
                "--select-at",
                "saved",
                "--reselect",
                "--select-items",
                "1",
                *layers,
            ],
            "--select-at set",
        ),
        (
            [
                "--capacities",
                "1103",
                "--layer-windows",
                "40",
                "40",
                "40",
                "4000",
                "--layer-topks",
                "16",
                "16",
                "16",
                "228",
            ],
            "keep 4232 slots in a layer",
        ),
        (["--capacities", "128", "64", *layers], "give one --capacities"),
        (["--capacities", "120", *layers], r"keep \[60, 60, 60, 332\]"),
    ]
    for extra, message in refusals:
        with pytest.raises(SystemExit, match=message):
            _script().main([*common, *extra])
    with pytest.raises(SystemExit):  # a prefix of --windows is no flag at all
        _script().parse_args(["--window", "40"])
    _script().main([*common, "--capacities", "128", *layers])
    folder = tmp_path / "out" / "mlp-128"
    want = budget_config("mlp", 128, 3, (40, 40, 40, 96), topk=(16, 16, 16, 232))
    assert saved_config(folder) == dataclasses.replace(want, lam=0.001)
    record = json.loads((folder / "training.json").read_text())
    assert record["trained_at_capacities"] == [60, 60, 60, 332]
    assert record["trained_at_capacity"] is None  # no one capacity
    assert (record["window"], record["topk"]) == ([40, 40, 40, 96], [16, 16, 16, 232])
    # Trained there: the work folder's scorer, saved by the trainer, carries the same budget.
    trained = tmp_path / "work" / "mlp-60w40-60w40-60w40-332w96" / "scorer"
    assert saved_config(trained) == saved_config(folder)
    kc.load_scorer(kc.transform(load_embedded_model(), saved_config(folder)), folder)


def test_decode_items_hold_the_models_own_continuation_and_select_in_both_protocols(
    tmp_path, monkeypatch
):
    module = _script()
    written = []

    def stretched(model, items, seq_len):
        rows = stretched_sequences(model, items, seq_len)
        written.append((items, rows))
        return rows

    monkeypatch.setattr(module, "stretched_sequences", stretched)
    model = load_embedded_model()
    texts = module.training_texts(8, 5, 0.25, 0.25, model)
    # Two plain windows' worth of shares: 2 recall items, 2 decode items, 4 text windows; every
    # one exactly one 2048-token sequence, the continuation's bytes kept exactly.
    assert len(texts) == 8 and all(len(module.byte_ids(t)) == 2048 for t in texts)
    ((items, rows),) = written
    assert items == [recall_items("train", task, 1024, 1, 5, families="train")[0]
                     for task in TASKS[:2]]  # fmt: skip
    ids = [module.byte_ids(t) for t in texts]
    assert sum(row.tolist() in ids for row in rows) == 2
    # Without decode items the same seed gives the same recall items and windows as before.
    plain = module.training_texts(8, 5, 0.25)
    assert sum(t in texts for t in plain) == 6
    refused = [((0.5, 0.5), "leave no ordinary text"),
               ((0.0, 1.0), r"--decode-fraction must be in \[0, 1\), got 1.0")]  # fmt: skip
    for fractions, message in refused:
        with pytest.raises(ValueError, match=message):
            module.training_texts(8, 5, *fractions, model)
    with pytest.raises(ValueError, match="need the model that continues them"):
        module.training_texts(8, 5, 0.0, 0.25)
    with pytest.raises(SystemExit, match=r"--decode-fraction must be in \[0, 1\), got 1.5"):
        module.main(["--decode-fraction", "1.5"])  # refused before any model is loaded


def test_the_selection_spec_names_the_decode_protocol():
    module = _script()
    spec = module.selection_spec(module.parse_args(["--select-items", "2"]))
    assert "protocols" not in spec  # the prefill protocol alone: as records before it existed
    args = module.parse_args(["--select-items", "2", "--select-protocols", "prefill", "decode"])
    assert module.selection_spec(args)["protocols"] == ["prefill", "decode"]
    assert module.selection_spec(args)["decode_length"] == 1024
    twice = ["--select-items", "2", "--select-protocols", "decode", "prefill", "decode"]
    assert module.selection_spec(module.parse_args(twice))["protocols"] == ["decode", "prefill"]
    with pytest.raises(SystemExit):
        module.parse_args(["--select-protocols", "teacher_forced"])
