"""The recall report: resuming a cut-off run, each family group in tables of its own, and the
recall targets on both sides of their floors."""

import copy
import json

import pytest
import torch

from kvpop_compile.embedded import load_embedded_model
from kvpop_compile.evaluation.methods import Method, methods, scorer_folder
from kvpop_compile.evaluation.recall.protocol import (
    RecallSettings,
    recall_settings_record,
    run_recall,
)
from kvpop_compile.evaluation.recall.report import (
    evaluate_recall,
    recall_document,
    recall_markdown,
    recall_targets,
    resumable_methods,
    summarize_recall,
)
from kvpop_compile.scorer_io import tensors_sha256


@pytest.fixture(scope="module")
def model():
    return load_embedded_model()


def test_a_cut_off_run_resumes_where_it_stopped(model, tmp_path):
    """recall.json is saved after every method; ``resume`` keeps what it holds and runs only the
    missing methods, and other policies add rows to the saved run."""
    settings = RecallSettings(tasks=("lookup",), lengths=(1024,), items=2, batch=2,
                              protocols=("prefill",), families=("held_out",))  # fmt: skip
    full, window = Method(None, None), Method("window", "88%")
    memory = methods(["memory"], ["88%"])[1]  # at the window its shipped scorer was saved with
    # The memory scorer is missing from this root: the run stops at its third method.
    with pytest.raises(FileNotFoundError, match="no trained memory scorer"):
        evaluate_recall(model, tmp_path, methods=[full, window, memory], settings=settings,
                        scorer_root=tmp_path / "no-scorers", progress=False)  # fmt: skip
    saved = json.loads((tmp_path / "recall.json").read_text())
    assert list(saved["methods"]) == ["full", "window @ 88%"]
    # Mark the saved window row, so that a rerun would show.
    saved["methods"]["window @ 88%"]["prefill"]["held_out/lookup@1024"] = [1.0, 0.5]
    (tmp_path / "recall.json").write_text(json.dumps(saved))
    results = evaluate_recall(model, tmp_path, methods=[full, memory, Method("random", "75%")],
                              settings=settings, progress=False, resume=True)  # fmt: skip
    assert list(results["methods"]) == ["full", "random @ 75%", "memory @ 88%", "window @ 88%"]
    assert results["methods"]["window @ 88%"]["prefill"]["held_out/lookup@1024"] == [1.0, 0.5]
    assert results["methods"]["full"] == saved["methods"]["full"]
    assert json.loads((tmp_path / "recall.json").read_text())["methods"] == results["methods"]
    assert results["methods"]["memory @ 88%"]["scorer_sha256"] == tensors_sha256(
        scorer_folder("memory", 256)
    )
    # The same name with other weights (a retrained model) does not resume: its rows would
    # mix two models.
    retrained = copy.deepcopy(model)
    with torch.no_grad():
        retrained.lm_head.weight.mul_(1.01)
    with pytest.raises(ValueError, match="cannot resume: the saved recall.json was run with "
                       "model_sha256"):  # fmt: skip
        evaluate_recall(retrained, tmp_path, methods=[full], settings=settings, progress=False,
                        resume=True)  # fmt: skip
    # Without resume the run starts over.
    fresh = evaluate_recall(model, tmp_path, methods=[full, window], settings=settings,
                            progress=False)  # fmt: skip
    assert fresh["methods"]["window @ 88%"]["prefill"]["held_out/lookup@1024"] != [1.0, 0.5]
    with pytest.raises(ValueError, match="include 'full' among the methods"):
        run_recall(model, [window], settings=settings)


def test_resume_refuses_a_run_with_other_settings():
    saved = {"items": 2, "families": ["held_out"], "tasks": ["lookup"], "lengths": [1024],
             "protocols": ["prefill"], "stretch": {"1024": 0}, "model": "m",
             "methods": {"full": {}}}  # fmt: skip
    expected = {k: v for k, v in saved.items() if k != "methods"}
    assert resumable_methods(saved, {**expected, "seed": 0}) == {"full": {}}  # seed 0 by default
    with pytest.raises(ValueError, match="was run with items 2, this run asks items 3"):
        resumable_methods(saved, {**expected, "items": 3})
    with pytest.raises(ValueError, match="was run with model 'm', this run asks model 'other'"):
        resumable_methods(saved, {**expected, "model": "other"})
    # A results file of items without family groups never merges with one that has them.
    record = recall_settings_record(RecallSettings(tasks=("lookup",), lengths=(1024,), items=2),
                                    2048)  # fmt: skip
    old = {k: v for k, v in record.items() if k != "families"}
    with pytest.raises(ValueError, match="was run with families None, this run asks families "
                       r"\['train', 'held_out'\]"):  # fmt: skip
        resumable_methods({**old, "methods": {"full": {}}}, record)


def _ones(hits: int, n: int = 20) -> list[float]:
    return [1.0] * hits + [0.0] * (n - hits)


def test_the_report_prints_each_family_group_in_tables_of_its_own():
    """Trained-family and held-out-family rows apart, per protocol; columns by task (in the
    order of TASKS) then length; a method without a group's figures has an empty cell."""
    ones, zeros = [1.0] * 4, [0.0] * 4
    results = {
        "protocols": ["prefill", "decode"],
        "methods": {
            "full": {"prefill": {"train/chain@2048": ones, "train/lookup@2048": ones,
                                 "train/lookup@1024": ones, "held_out/lookup@2048": ones,
                                 "held_out/chain@2048": zeros},
                     "decode": {"held_out/multi_key@1024": ones}},
            "window @ 88%": {"prefill": {"train/chain@2048": ones, "train/lookup@2048": zeros,
                                         "train/lookup@1024": zeros,
                                         "held_out/lookup@2048": zeros,
                                         "held_out/chain@2048": ones},
                             "decode": {"held_out/multi_key@1024": zeros}},
            "memory @ 88%": {"prefill": {"held_out/lookup@2048": ones,
                                         "held_out/chain@2048": ones},
                             "decode": {"held_out/multi_key@1024": ones}},
        },
    }  # fmt: skip
    hundred, nothing = "100.0 [100.0, 100.0]", "0.0 [0.0, 0.0]"
    assert recall_markdown(results, summarize_recall(results)) == "\n".join([
        "### prefill protocol, trained families: exact match %",
        "",
        "| method | lookup@1024 | lookup@2048 | chain@2048 |",
        "|---|---|---|---|",
        f"| full | {hundred} | {hundred} | {hundred} |",
        f"| window @ 88% | {nothing} | {nothing} | {hundred} |",
        "| memory @ 88% |  |  |  |",
        "",
        "### prefill protocol, held-out families: exact match %",
        "",
        "| method | lookup@2048 | chain@2048 |",
        "|---|---|---|",
        f"| full | {hundred} | {nothing} |",
        f"| window @ 88% | {nothing} | {hundred} |",
        f"| memory @ 88% | {hundred} | {hundred} |",
        "",
        "### decode protocol, held-out families: exact match %",
        "",
        "| method | multi_key@1024 |",
        "|---|---|",
        f"| full | {hundred} |",
        f"| window @ 88% | {nothing} |",
        f"| memory @ 88% | {hundred} |",
    ])  # fmt: skip
    # Results of items without family groups: one table per protocol, and no target judged.
    old = {"protocols": ["prefill"], "items": 4, "lengths": [2048], "stretch": {"2048": 0},
           "methods": {"full": {"prefill": {"lookup@2048": ones}}}}  # fmt: skip
    assert recall_markdown(old, summarize_recall(old)).splitlines()[:3] == [
        "### prefill protocol, exact match %", "", "| method | lookup@2048 |",
    ]  # fmt: skip
    assert recall_targets(old, summarize_recall(old)) == []
    assert "- none: these results have no family groups" in recall_document(old)


def _judged(families: str, **hits: int) -> list[str]:
    """The target lines of a run whose methods (``full``, ``memory_75``, ``memory_88``,
    ``window_88``) answer ``hits`` of 20 items of one group at 2048 bytes, in order."""
    names = {"full": "full", "memory_75": "memory @ 75%", "memory_88": "memory @ 88%",
             "window_88": "window @ 88%"}  # fmt: skip
    group = f"{families}/lookup@2048"
    results = {
        "protocols": ["prefill"],
        "methods": {names[m]: {"prefill": {group: _ones(k)}} for m, k in hits.items()},
    }
    return recall_targets(results, summarize_recall(results))


@pytest.mark.parametrize(
    ("families", "hits", "line"),
    [
        # full attention: >= 90% on trained families, >= 80% on held-out ones
        ("train", 18, "- full attention ≥ 90% on trained families, lookup@2048 (prefill): met — "
         "90.0%"),
        ("train", 17, "- full attention ≥ 90% on trained families, lookup@2048 (prefill): "
         "missed — 85.0%"),
        ("held_out", 16, "- full attention ≥ 80% on held-out families, lookup@2048 (prefill): "
         "met — 80.0%"),
        ("held_out", 15, "- full attention ≥ 80% on held-out families, lookup@2048 (prefill): "
         "missed — 75.0%"),
    ],
)  # fmt: skip
def test_full_attentions_target_on_both_sides_of_its_floor(families, hits, line):
    assert _judged(families, full=hits) == [line]


@pytest.mark.parametrize(
    ("families", "budget", "hits", "verdict"),
    [
        ("train", "75%", 19, "met — 95.0%"), ("train", "75%", 18, "missed — 90.0%"),
        ("held_out", "75%", 18, "met — 90.0%"), ("held_out", "75%", 17, "missed — 85.0%"),
        ("train", "88%", 18, "met — 90.0%"), ("train", "88%", 17, "missed — 85.0%"),
        ("held_out", "88%", 17, "met — 85.0%"), ("held_out", "88%", 16, "missed — 80.0%"),
    ],
)  # fmt: skip
def test_memorys_retention_targets_on_both_sides_of_their_floors(families, budget, hits, verdict):
    # Full attention answers all 20: the retention is memory's own share.
    floors = {("train", "75%"): 95, ("held_out", "75%"): 90, ("train", "88%"): 90,
              ("held_out", "88%"): 85}  # fmt: skip
    group = {"train": "trained families", "held_out": "held-out families"}[families]
    lines = _judged(families, full=20, **{f"memory_{budget[:2]}": hits})
    (line,) = [line for line in lines if "keeps" in line]
    assert line.startswith(
        f"- `memory` at {budget} keeps ≥ {floors[families, budget]}% of full attention on "
        f"{group}, lookup@2048 (prefill): {verdict} (95% interval "
    )


def test_a_retention_of_too_few_answers_has_no_interval():
    # Full attention answers 1 of 20, so most resamples hold none of its answers: no ratio.
    (line,) = [line for line in _judged("train", full=1, memory_88=1) if "keeps" in line]
    assert line.endswith("met — 100.0% (no interval: full attention answers too few of these "
                         "items)")  # fmt: skip
    (line,) = [line for line in _judged("train", full=20, memory_88=19) if "keeps" in line]
    assert "(95% interval " in line and "nan" not in line


@pytest.mark.parametrize("families", ["train", "held_out"])
@pytest.mark.parametrize(
    ("memory", "window", "verdict"),
    [
        # 70% - 40% is 0.29999999999999993 in floats: a lead of exactly 30 points is met
        (14, 8, "met — 70.0% against window's 40.0% (+30.0 points)"),
        (14, 9, "missed — 70.0% against window's 45.0% (+25.0 points)"),
        (20, 14, "met — 100.0% against window's 70.0% (+30.0 points)"),
        (19, 14, "missed — 95.0% against window's 70.0% (+25.0 points)"),
    ],
)  # fmt: skip
def test_memorys_lead_over_the_best_heuristic_on_both_sides_of_30_points(
    families, memory, window, verdict
):
    group = {"train": "trained families", "held_out": "held-out families"}[families]
    lines = _judged(families, full=20, memory_88=memory, window_88=window)
    assert [line for line in lines if "ahead" in line] == [
        f"- `memory` at 88% ≥ 30 points ahead of the best heuristic on {group}, lookup@2048 "
        f"(prefill): {verdict}; kvpress's presses not run in the prefill protocol"
    ]


def test_validation_families_and_other_lengths_are_shown_but_not_judged():
    results = {
        "protocols": ["prefill"],
        "methods": {
            "full": {"prefill": {"validation/lookup@2048": _ones(20),
                                 "train/lookup@1024": _ones(20)}},
            "memory @ 88%": {"prefill": {"validation/lookup@2048": _ones(0),
                                         "train/lookup@1024": _ones(0)}},
        },
    }  # fmt: skip
    assert recall_targets(results, summarize_recall(results)) == []
    assert "### prefill protocol, validation families: exact match %" in recall_markdown(
        results, summarize_recall(results)
    )


def test_decode_targets_are_judged_at_the_length_the_decode_protocol_ran():
    # The decode protocol fits only shorter items (the stretch needs positions): memory's
    # targets there are judged at 1024 bytes; full attention's stays a 2048-byte target.
    items = {"prefill": {"train/lookup@2048": [1.0] * 4},
             "decode": {"train/lookup@1024": [1.0] * 4}}  # fmt: skip
    results = {
        "protocols": ["prefill", "decode"],
        "methods": {
            "full": items,
            "memory @ 88%": {"prefill": {"train/lookup@2048": [1.0, 1.0, 1.0, 0.0]},
                             "decode": {"train/lookup@1024": [1.0, 1.0, 0.0, 0.0]}},
            "window @ 88%": {"prefill": {"train/lookup@2048": [0.0] * 4},
                             "decode": {"train/lookup@1024": [0.0] * 4}},
        },
    }  # fmt: skip
    lines = recall_targets(results, summarize_recall(results))
    assert (
        "- full attention ≥ 90% on trained families, lookup@2048 (prefill): met — 100.0%" in lines
    )
    assert not any(
        "full attention ≥ 90% on trained families, lookup@1024" in line for line in lines
    )
    assert (
        "- `memory` at 88% keeps ≥ 90% of full attention on trained families, lookup@1024 "
        "(decode): missed — 50.0% (95% interval 0.0-100.0%)" in lines
    )
    assert any(
        "best heuristic on trained families, lookup@1024 (decode): met — 50.0%" in line
        for line in lines
    )
    # Prefill at 1024 bytes alone has no target to judge, and the report says so.
    short = {"protocols": ["prefill"], "items": 4, "lengths": [1024], "stretch": {"1024": 0},
             "families": ["train"],
             "methods": {name: {"prefill": {"train/lookup@1024":
                                            record["prefill"]["train/lookup@2048"]}}
                         for name, record in results["methods"].items()}}  # fmt: skip
    assert recall_targets(short, summarize_recall(short)) == []
    assert "- none here: the targets are at 2048 bytes" in recall_document(short)


def test_the_report_says_how_much_a_budget_compresses_items_of_other_lengths():
    # A budget keeps a fixed number of tokens, so 1024-byte prompts are compressed less than
    # its name says, and the decode protocol's stretch brings the question to 2048 positions.
    row = {"prefill": {"train/lookup@1024": [1.0]}, "decode": {"train/lookup@1024": [1.0]}}
    results = {"protocols": ["prefill", "decode"], "items": 1, "lengths": [1024, 2048],
               "stretch": {"1024": 1024, "2048": 0}, "families": ["train"],
               "methods": {"full": row}}  # fmt: skip
    sentence = (
        "Budgets are named by the compression of a 2048-token context: each layer and KV head "
        'keeps 512 tokens at "75%" and 256 at "88%" at every length (at 1024 bytes they compress '
        "the prompt by 50% and 75%, and the 2048 positions decode reaches by 75% and 88%)."
    )
    assert sentence in recall_document(results)
    # A shorter stretch reaches fewer positions; a prefill-only run says nothing of decode.
    capped = {**results, "stretch": {"1024": 256, "2048": 0}}
    assert "and the 1280 positions decode reaches by 60% and 80%)." in recall_document(capped)
    prefill = {
        **results,
        "protocols": ["prefill"],
        "methods": {"full": {"prefill": row["prefill"]}},
    }
    assert "(at 1024 bytes they compress the prompt by 50% and 75%)." in recall_document(prefill)
    # Items of the benchmark's own length need no such sentence.
    full_length = {**results, "lengths": [2048], "stretch": {"2048": 0}}
    assert "Budgets are named" not in recall_document(full_length)


def test_a_retention_target_prints_the_interval_of_paired_draws():
    # The same draws of items for both methods: a policy that answers exactly the items full
    # attention answers keeps 100% in every draw, however many items both miss; drawn
    # separately, the two accuracies would scatter and widen the interval.
    answered = [1.0] * 48 + [0.0] * 16
    one_more_miss = [0.0] + answered[1:]
    results = {
        "protocols": ["prefill"],
        "methods": {
            "full": {"prefill": {"held_out/chain@2048": answered}},
            "memory @ 75%": {"prefill": {"held_out/chain@2048": answered}},
            "memory @ 88%": {"prefill": {"held_out/chain@2048": one_more_miss}},
        },
    }
    lines = recall_targets(results, summarize_recall(results))
    assert (
        "- `memory` at 75% keeps ≥ 90% of full attention on held-out families, chain@2048 "
        "(prefill): met — 100.0% (95% interval 100.0-100.0%)" in lines
    )
    (line,) = [line for line in lines if "at 88% keeps" in line]
    low, high = (float(x) for x in line.split("interval ")[1].rstrip("%)").split("-"))
    assert line.startswith(
        "- `memory` at 88% keeps ≥ 85% of full attention on held-out families, chain@2048"
    )
    assert "met — 97.9%" in line  # 47 of full attention's 48
    assert 90.0 < low < 97.9 <= high <= 100.0
