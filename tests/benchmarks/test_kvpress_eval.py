"""The kvpress driver: per-sequence figures, long-range slicing and failed presses; recall items,
their exact match, and the recall report's join."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from script_support import load_script

from kvpop_compile.atomic import atomic_write
from kvpop_compile.cli.commands import eval_command
from kvpop_compile.embedded import load_embedded_model
from kvpop_compile.embedded.corpus import encode
from kvpop_compile.embedded.model import EMBEDDED_MODEL
from kvpop_compile.embedded.recall import recall_items
from kvpop_compile.evaluation.data import Sequence
from kvpop_compile.evaluation.methods import BUDGETS
from kvpop_compile.evaluation.quality.long_range import long_range_targets
from kvpop_compile.evaluation.recall.kvpress import summarize_kvpress_recall
from kvpop_compile.evaluation.recall.protocol import (
    RECALL_SEED,
    RecallSettings,
    answer_exactly,
    decode_stretch,
)
from kvpop_compile.evaluation.recall.protocol import recall_groups as benchmark_groups
from kvpop_compile.evaluation.recall.report import recall_document

# "alpha_name" at byte 0 and again at byte 130: bytes 131..139 complete it from memory (its
# previous occurrence is more than 64 bytes back), so they are the only long-range targets.
TEXT = b"alpha_name" + b"." * 120 + b"alpha_name" + b"." * 20
IDS = encode(TEXT)  # (160,)
OTHER = encode(TEXT.replace(b"alpha_name", b"omega_name", 1))  # no name is repeated
PROMPT = 100  # scored targets are bytes 101..159: 59 of them, long-range at indices 30..38
SCORED = len(TEXT) - PROMPT - 1
LONG_RANGE = range(131 - PROMPT - 1, 140 - PROMPT - 1)

kvpress_eval = load_script("benchmarks/kvpress_eval.py")
kvpress_merge = load_script("benchmarks/kvpress_merge.py")
DECODE_INTERVAL = kvpress_eval.DECODE_INTERVAL
main = kvpress_eval.main
part_name = kvpress_eval.part_name
question_cut = kvpress_eval.question_cut
recall_groups = kvpress_eval.recall_groups
recall_job = kvpress_eval.recall_job
run_worker = kvpress_eval.run_worker
runnable_protocols = kvpress_eval.runnable_protocols
same_shape = kvpress_eval.same_shape
sequence_figures = kvpress_eval.sequence_figures
summarise = kvpress_eval.summarise
summarise_recall = kvpress_eval.summarise_recall


def _outcome(hit_indices, nll: float = 0.5) -> dict:
    correct = [int(i in hit_indices) for i in range(SCORED)]
    return {"correct": [correct], "nll": [[nll] * SCORED]}


def test_figures_of_one_sequence():
    hits = set(range(10)) | {30, 31, 32, 33}  # four of the nine long-range targets
    outcome = _outcome(hits, nll=0.25)
    figures = sequence_figures(IDS, outcome["correct"][0], outcome["nll"][0], PROMPT)
    assert figures == {
        "accuracy": pytest.approx(14 / SCORED),
        "nll": pytest.approx(0.25),
        "long_range_correct": 4,
        "long_range_count": 9,
    }


@given(st.integers(0, len(TEXT) - 2))
def test_long_range_targets_are_restricted_to_the_scored_bytes(prompt):
    scored = len(TEXT) - prompt - 1
    figures = sequence_figures(IDS, [1] * scored, [0.0] * scored, prompt)
    # Long-range bytes are 131..139; scored targets start at byte prompt + 1.
    expected = min(9, max(0, 139 - prompt))
    assert figures["long_range_count"] == figures["long_range_correct"] == expected
    assert figures["accuracy"] == 1.0


def test_wrong_number_of_targets_is_rejected():
    with pytest.raises(ValueError, match="expected 59 scored targets"):
        sequence_figures(IDS, [1] * 58, [0.0] * 58, PROMPT)


def test_summary_keeps_failed_presses_as_errors():
    sequences = [Sequence("a.py@0", IDS), Sequence("b.py@0", OTHER)]
    hit = _outcome(set(LONG_RANGE))
    miss = _outcome(set())
    worker = {
        "versions": {"kvpress": "0.5.5", "transformers": "5.2.0", "torch": "2.13.0"},
        "results": {
            "snapkv": {"75%": {"correct": hit["correct"] + miss["correct"],
                               "nll": hit["nll"] + [[1.5] * SCORED]},
                       "88%": {"error": "AssertionError: too short"}},
            "tova": {"75%": {"error": "RuntimeError: boom"}},
        },
    }  # fmt: skip
    summary = summarise(worker, sequences, PROMPT)
    assert summary["versions"] == worker["versions"]
    snapkv = summary["results"]["snapkv"]["75%"]
    first, second = snapkv["sequences"]
    assert first == {"source": "a.py@0", "accuracy": pytest.approx(9 / SCORED),
                     "nll": pytest.approx(0.5), "long_range_correct": 9,
                     "long_range_count": 9}  # fmt: skip
    assert second["long_range_count"] == second["long_range_correct"] == 0
    assert snapkv["accuracy"] == pytest.approx(4.5 / SCORED)
    assert snapkv["nll"] == pytest.approx(1.0)
    assert snapkv["long_range_accuracy"] == 1.0
    assert summary["results"]["snapkv"]["88%"] == {"error": "AssertionError: too short"}
    assert summary["results"]["tova"] == {"75%": {"error": "RuntimeError: boom"}}
    assert summary["errors"] == [
        "snapkv 88%: AssertionError: too short",
        "tova 75%: RuntimeError: boom",
    ]


def test_summary_rejects_a_result_for_other_sequences():
    worker = {"versions": {}, "results": {"knorm": {"75%": _outcome(set())}}}
    with pytest.raises(ValueError, match="1 results for 2 sequences"):
        summarise(worker, [Sequence("a", IDS), Sequence("b", IDS)], PROMPT)


def test_summary_is_written_atomically(tmp_path):
    path = tmp_path / "results" / "kvpress.json"
    path.parent.mkdir()
    for value in (1, 2):
        atomic_write(path, lambda tmp, v=value: Path(tmp).write_text(json.dumps({"a": v})))
    assert json.loads(path.read_text()) == {"a": 2}
    assert [p.name for p in path.parent.iterdir()] == ["kvpress.json"]


def test_fixture_long_range_targets():
    assert not long_range_targets(OTHER, 64).any()
    assert torch.equal(long_range_targets(IDS, 64).nonzero()[:, 0], torch.arange(131, 140))


# --- recall: the driver's items, its summary, and the report's join -------------------------

RECALL_GROUP = "held_out/lookup@2048"
OLD_GROUP = "lookup@2048"  # a group's name in files written before items had families


def _worker_answers(items, wrong: set[int]) -> list[list[int]]:
    """Greedy answer tokens as the worker writes them: each item's answer, with its last byte
    changed for the items in ``wrong``."""
    answers = []
    for index, item in enumerate(items):
        tokens = list(item.answer)
        if index in wrong:
            tokens[-1] = (tokens[-1] + 1) % 256
        answers.append(tokens)
    return answers


def _recall_outcome(groups, wrong: dict[str, set[int]] | None = None) -> dict:
    """A worker outcome for every group: answers under the job's part names, with the items
    of ``wrong[group]`` (indices in the group) answered wrongly."""
    wrong = wrong or {}
    answers = {g: _worker_answers(items, wrong.get(g, set())) for g, items in groups.items()}
    return {part_name(g, p): [answers[g][i] for i in indices] for g, items in groups.items()
            for p, indices in enumerate(same_shape(items))}  # fmt: skip


def test_driver_asks_the_recall_benchmarks_items_by_family_group():
    groups = recall_groups(("lookup", "chain"), (1024,), 6)
    assert list(groups) == ["train/lookup@1024", "train/chain@1024", "held_out/lookup@1024",
                            "held_out/chain@1024"]  # fmt: skip
    ours = benchmark_groups(RecallSettings(tasks=("lookup", "chain"), lengths=(1024,), items=6))
    for (families, task, length), items in ours.items():
        assert groups[f"{families}/{task}@{length}"] == items
    job = recall_job(groups, ("prefill", "decode"), max_positions=2048, batch=2)
    assert job["budgets"] == ["75%", "88%"] and job["decode_interval"] == DECODE_INTERVAL
    # Held-out families differ in value length and question: a group is cut into parts of one
    # shape, which together hold each of its items once, in item order within a part.
    assert len(job["groups"]) > len(groups)
    for name, items in groups.items():
        parts = [g for g in job["groups"] if g["name"].rpartition("#")[0] == name]
        seen = []
        for part in parts:
            indices = [i for i, item in enumerate(items)
                       if encode(item.prompt).tolist() in part["prompts"]]  # fmt: skip
            assert part["prompts"] == [encode(items[i].prompt).tolist() for i in indices]
            assert part["answers"] == [encode(items[i].answer).tolist() for i in indices]
            assert (
                len({len(p) for p in part["prompts"]})
                == len({len(a) for a in part["answers"]})
                == 1
            )
            for i in indices:  # where greedy_answers cuts
                assert part["cut"] == len(items[i].prompt) - len(items[i].question) + 1
            # The recall benchmark's methods keep 512 and 256 tokens at every length; so do
            # the presses, not a quarter and an eighth of the shorter prompt.
            assert part["kept"] == BUDGETS == {"75%": 512, "88%": 256}
            assert part["stretch"] == decode_stretch(1024, 2048) == 1024
            seen += indices
        assert sorted(seen) == list(range(len(items)))


def test_the_driver_runs_the_presses_and_budgets_asked_for(tmp_path, capsys):
    groups = recall_groups(("lookup",), (1024,), 2)
    job = recall_job(groups, ("decode",), 2048, 2, presses=("snapkv", "tova"), budgets=("88%",))
    assert (job["presses"], job["budgets"], job["protocols"]) == (
        ["snapkv", "tova"], ["88%"], ["decode"]
    )  # fmt: skip
    for argv, message in (
        (["--recall", "--presses", "snapkv,h2o"], "presses must be among none, snapkv, "
         "expected_attention, tova, knorm, streaming_llm; got 'h2o'"),
        (["--recall", "--budgets", "50%"], "budgets must be among 75%, 88%; got '50%'"),
        (["--presses", "snapkv"], "--presses and --budgets choose among the recall runs: give "
         "--recall too"),
    ):  # fmt: skip
        with pytest.raises(SystemExit):
            main([*argv, "--venv", str(tmp_path / "venv")])
        assert message in capsys.readouterr().err
    assert not (tmp_path / "venv").exists()


def test_decode_protocol_is_left_out_where_no_stretch_fits():
    assert runnable_protocols(("prefill", "decode"), (2048,), 2048) == ("prefill",)
    assert runnable_protocols(("prefill", "decode"), (1024, 2048), 2048) == ("prefill", "decode")


def test_a_model_folder_without_a_config_is_refused_before_any_venv_is_made(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--model", str(tmp_path), "--venv", str(tmp_path / "venv")])
    assert f"--model {tmp_path}: no config.json there" in capsys.readouterr().err
    assert not (tmp_path / "venv").exists()


def test_items_with_different_question_starts_are_refused():
    items = recall_items("held_out", "lookup", 1024, 2)
    assert len({len(i.prompt) - len(i.question) for i in items}) == 2
    with pytest.raises(ValueError, match="share the question's start"):
        question_cut(items)


def test_recall_summary_gives_exact_match_per_item_in_item_order_and_keeps_errors():
    groups = recall_groups(("lookup",), (2048,), 6, families=("held_out",))
    assert len(same_shape(groups[RECALL_GROUP])) > 1  # the join puts parts back in order
    worker = {
        "versions": {"kvpress": "0.5.5"},
        "results": {
            "none": {"0%": {"prefill": _recall_outcome(groups)}},
            "snapkv": {
                "75%": {"prefill": _recall_outcome(groups, {RECALL_GROUP: {1, 4}})},
                "88%": {"prefill": {"error": "AssertionError: too short"}},
            },
        },
    }
    summary = summarise_recall(worker, groups)
    assert summary["results"]["none"]["0%"]["prefill"] == {RECALL_GROUP: [1.0] * 6}
    snapkv = summary["results"]["snapkv"]["75%"]["prefill"]
    assert snapkv == {RECALL_GROUP: [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]}
    assert summary["exact_match"]["snapkv"]["75%"]["prefill"][RECALL_GROUP] == pytest.approx(4 / 6)
    assert summary["results"]["snapkv"]["88%"]["prefill"] == {"error": "AssertionError: too short"}
    assert summary["errors"] == ["snapkv 88% prefill: AssertionError: too short"]


def _run_summary(results: dict, budgets: dict, elapsed: float, **fields) -> dict:
    """A recall file of the given per-item ``results``, identical in every field that names
    its items, model and kvpress unless ``fields`` says otherwise."""
    same = {field: f"same {field}" for field in kvpress_merge.SAME_RUN}
    means = {
        press: {b: {p: {g: sum(v) / len(v) for g, v in o.items()} for p, o in by_p.items()
                    if "error" not in o} for b, by_p in by_b.items()}
        for press, by_b in results.items()
    }  # fmt: skip
    return {**same, **fields, "results": results, "exact_match": means, "errors": [],
            "budgets": budgets, "elapsed_s": elapsed}  # fmt: skip


def test_recall_runs_of_other_budgets_merge_and_a_later_run_replaces_what_it_measured_again(
    tmp_path, capsys
):
    at_88 = _run_summary(
        {"tova": {"88%": {"decode": {"a": [1.0, 0.0]}}},
         "snapkv": {"88%": {"decode": {"error": "RuntimeError: out of memory"}}}},
        {"1024": {"88%": 240}}, 100.0,
    )  # fmt: skip
    at_75 = _run_summary(
        {"tova": {"75%": {"decode": {"a": [1.0, 1.0]}}},
         "snapkv": {"88%": {"decode": {"a": [0.0, 1.0]}}, "75%": {"decode": {"a": [0.0, 0.0]}}}},
        {"1024": {"75%": 512, "88%": 240}}, 50.5,
    )  # fmt: skip
    merged = kvpress_merge.merge_recall_summaries([at_88, at_75])
    assert merged["results"] == {
        "tova": {"88%": {"decode": {"a": [1.0, 0.0]}}, "75%": {"decode": {"a": [1.0, 1.0]}}},
        "snapkv": {"88%": {"decode": {"a": [0.0, 1.0]}}, "75%": {"decode": {"a": [0.0, 0.0]}}},
    }
    assert merged["exact_match"]["tova"] == {"88%": {"decode": {"a": 0.5}},
                                             "75%": {"decode": {"a": 1.0}}}  # fmt: skip
    assert merged["exact_match"]["snapkv"]["88%"] == {"decode": {"a": 0.5}}
    assert merged["errors"] == []  # the failed run was measured again
    assert merged["budgets"] == {"1024": {"88%": 240, "75%": 512}}
    assert merged["elapsed_s"] == 150.5
    assert all(merged[field] == f"same {field}" for field in kvpress_merge.SAME_RUN)
    # In the other order the failure is the later word, and stays an error.
    backwards = kvpress_merge.merge_recall_summaries([at_75, at_88])
    assert backwards["errors"] == ["snapkv 88% decode: RuntimeError: out of memory"]
    assert backwards["exact_match"]["snapkv"]["88%"] == {}  # as a failed run summarises
    # Through the command line, into a file, with nothing run.
    files = [tmp_path / "88.json", tmp_path / "75.json"]
    for path, summary in zip(files, (at_88, at_75), strict=True):
        path.write_text(json.dumps(summary))
    main(["--merge", *map(str, files), "--out", str(tmp_path / "out.json"),
          "--venv", str(tmp_path / "venv")])  # fmt: skip
    assert json.loads((tmp_path / "out.json").read_text()) == merged
    assert not (tmp_path / "venv").exists()


@pytest.mark.parametrize("field", ["items", "model_sha256", "versions", "seed", "lengths"])
def test_recall_runs_on_other_items_models_or_kvpress_do_not_merge(field, tmp_path, capsys):
    one = _run_summary({"tova": {"88%": {"decode": {"a": [1.0]}}}}, {"1024": {"88%": 240}}, 1.0)
    other = _run_summary({"tova": {"75%": {"decode": {"a": [1.0]}}}}, {"1024": {"75%": 512}}, 1.0,
                         **{field: "another"})  # fmt: skip
    with pytest.raises(ValueError, match=f"run 1 differs from run 0 in '{field}' \\('another' "
                                         f"against 'same {field}'\\)"):  # fmt: skip
        kvpress_merge.merge_recall_summaries([one, other])
    files = [tmp_path / "one.json", tmp_path / "other.json"]
    for path, summary in zip(files, (one, other), strict=True):
        path.write_text(json.dumps(summary))
    for argv, message in (
        (["--merge", *map(str, files), "--out", str(tmp_path / "out.json")],
         f"--merge: run 1 differs from run 0 in '{field}'"),
        (["--merge", str(files[0])], "--merge writes to --out: give --out FILE"),
        (["--merge", str(tmp_path / "none.json"), "--out", str(tmp_path / "out.json")],
         f"--merge: no such file: {tmp_path / 'none.json'}"),
    ):  # fmt: skip
        with pytest.raises(SystemExit):
            main(argv)
        assert message in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


def test_recall_summary_refuses_answers_for_other_items():
    (item,) = recall_groups(("lookup",), (2048,), 1, families=("train",))["train/lookup@2048"]
    groups = {"train/lookup@2048": [item, item]}  # two items of one shape: one part
    (part,) = _recall_outcome(groups)

    def worker(answers: dict) -> dict:
        return {"versions": {}, "results": {"knorm": {"88%": {"prefill": answers}}}}

    with pytest.raises(ValueError, match="knorm 88% prefill: unknown groups"):
        summarise_recall(worker({OLD_GROUP: _worker_answers([item] * 2, set())}), groups)
    with pytest.raises(ValueError):  # fewer answers than the part has items
        summarise_recall(worker({part: _worker_answers([item], set())}), groups)
    with pytest.raises(ValueError, match="an answer of 3 tokens"):
        summarise_recall(worker({part: [[1, 2, 3]] * 2}), groups)


def _recall_results(memory: list[float]) -> dict:
    """recall.json as ``kvpop-compile eval --recall`` writes it, for one group of 4 items."""
    record = {  # method name -> per-item exact match on RECALL_GROUP
        "full": [1.0, 1.0, 1.0, 0.0], "memory @ 88%": memory, "window @ 88%": [0.0] * 4,
    }  # fmt: skip
    return {
        "items": 4, "families": ["held_out"], "tasks": ["lookup"], "lengths": [2048],
        "protocols": ["prefill"], "stretch": {"2048": 0}, "model": "the embedded model",
        "methods": {
            name: {"policy": None if name == "full" else name.split(" @ ")[0],
                   "budget": None if name == "full" else "88%",
                   "prefill": {RECALL_GROUP: exact}}
            for name, exact in record.items()
        },
    }  # fmt: skip


def _kvpress_recall(snapkv: list[float], items: int = 4, group: str = RECALL_GROUP) -> dict:
    """kvpress_recall.json as ``kvpress_eval.py --recall`` writes it, for one group."""
    return {
        "versions": {"kvpress": "0.5.5", "transformers": "5.2.0", "torch": "2.13.0"},
        "items": items, "seed": RECALL_SEED, "protocols": ["prefill"], "decode_interval": 65,
        "families": ["held_out"],
        "results": {
            "none": {"0%": {"prefill": {group: [1.0, 1.0, 1.0, 1.0][:items]}}},
            "snapkv": {"88%": {"prefill": {group: snapkv}},
                       "75%": {"prefill": {"error": "RuntimeError: boom"}}},
        },
    }  # fmt: skip


def _table(document: str, title: str) -> str:
    """The table under ``### title`` in a report."""
    return document.split(f"### {title}: exact match %\n\n")[1].split("\n\n")[0]


def test_recall_report_joins_the_presses_and_counts_them_among_the_heuristics():
    results = _recall_results(memory=[1.0, 1.0, 1.0, 0.0])
    document = recall_document(results, _kvpress_recall(snapkv=[1.0, 0.0, 0.0, 0.0]))
    # The press is a row of its family group's table, on the same items.
    table = _table(document, "prefill protocol, held-out families")
    assert table.splitlines()[0] == "| method | lookup@2048 |"
    assert table.splitlines()[-1].startswith("| kvpress snapkv @ 88% | 25.0 [")
    assert (
        "`memory` at 88% ≥ 30 points ahead of the best heuristic on held-out families, "
        "lookup@2048 (prefill): met — 75.0% against kvpress snapkv's 25.0% (+50.0 points)\n"
    ) in document
    assert "kvpress snapkv at 75% (prefill): failed: RuntimeError: boom" in document
    assert "answers 4 of 4 shared items exactly, this run's full attention 3; they agree on 3" in (
        document
    )
    # A press within 30 points of memory, or ahead of it, makes the target missed.
    document = recall_document(results, _kvpress_recall(snapkv=[1.0, 1.0, 0.0, 0.0]))
    assert "missed — 75.0% against kvpress snapkv's 50.0% (+25.0 points)" in document
    document = recall_document(results, _kvpress_recall(snapkv=[1.0, 1.0, 1.0, 1.0]))
    assert "missed — 75.0% against kvpress snapkv's 100.0% (-25.0 points)" in document


def test_a_kvpress_file_of_other_groups_is_not_compared():
    """Presses measured on items named without family groups (another generator's) are left
    out, with a note naming both runs' groups, and the targets lead only the project's own."""
    results = _recall_results(memory=[1.0, 1.0, 1.0, 0.0])
    stale = _kvpress_recall([1.0] * 4, group=OLD_GROUP)
    summary, notes = summarize_kvpress_recall(stale, results)
    assert summary == {}
    assert notes == [
        "kvpress recall: not compared (kvpress_recall.json holds groups lookup@2048, none of "
        "this run's held_out/lookup@2048: rerun benchmarks/kvpress_eval.py --recall)"
    ]
    document = recall_document(results, stale)
    assert "kvpress snapkv" not in document
    assert "held-out families, lookup@2048 (prefill): met — 75.0% against window's 0.0%" in (
        document
    )


def test_a_kvpress_file_that_kept_other_token_counts_is_not_compared():
    results = _recall_results(memory=[1.0, 1.0, 1.0, 0.0])
    same = {**_kvpress_recall([1.0] * 4), "budgets": {"2048": dict(BUDGETS)}}
    assert "kvpress snapkv @ 88%" in summarize_kvpress_recall(same, results)[0]
    # A run that kept a quarter and an eighth of a 1024-byte prompt kept half of what the
    # methods beside it keep: left out, by length and count.
    # A run of one budget, at the methods' count, is compared at that budget.
    one = {**same, "budgets": {"2048": {"88%": BUDGETS["88%"]}}}
    assert "kvpress snapkv @ 88%" in summarize_kvpress_recall(one, results)[0]
    for kept in ({"88%": BUDGETS["88%"] // 2}, {"50%": 1024}, {}):
        other = {**same, "budgets": {"2048": kept}}
        assert summarize_kvpress_recall(other, results)[0] == {}
    halved = {**same, "budgets": {"1024": {"75%": 256, "88%": 128}, "2048": dict(BUDGETS)}}
    summary, notes = summarize_kvpress_recall(halved, results)
    assert summary == {}
    assert notes == [
        "kvpress recall: not compared (kvpress_recall.json kept at 1024 bytes {'75%': 256, "
        "'88%': 128} tokens per layer and KV head, this run's methods {'75%': 512, '88%': 256} "
        "at every length: rerun benchmarks/kvpress_eval.py --recall)"
    ]


def test_recall_report_compares_the_items_both_runs_asked():
    results = _recall_results(memory=[1.0, 1.0, 1.0, 0.0])
    summary, notes = summarize_kvpress_recall(_kvpress_recall([1.0, 0.0], items=2), results)
    figures = summary["kvpress snapkv @ 88%"]["prefill"]
    assert figures[RECALL_GROUP].value == 0.5
    assert figures[f"{RECALL_GROUP} retention"].value == 0.5  # full attention: 2 of the 2
    assert any("it asked 2 items per group, this run 4: its rows and retention use the first 2"
               in note for note in notes)  # fmt: skip
    other_seed = {**_kvpress_recall([1.0] * 4), "seed": RECALL_SEED + 1}
    assert summarize_kvpress_recall(other_seed, results)[0] == {}
    # Rows of other model weights (a retrained model keeps its name) are left out, by name.
    ours = {**results, "model_sha256": "a" * 64}
    stale = {**_kvpress_recall([1.0] * 4), "model_sha256": "b" * 64}
    summary, notes = summarize_kvpress_recall(stale, ours)
    assert summary == {} and f"was run on model weights {'b' * 64}, this run on" in notes[0]
    same = {**stale, "model_sha256": "a" * 64}
    assert "kvpress snapkv @ 88%" in summarize_kvpress_recall(same, ours)[0]
    # Other family groups asked: the rows hold the groups both runs asked, and a note says so.
    wider = {**_kvpress_recall([1.0] * 4), "families": ["train", "held_out"]}
    summary, notes = summarize_kvpress_recall(wider, results)
    assert list(summary["kvpress snapkv @ 88%"]["prefill"]) == [
        RECALL_GROUP, f"{RECALL_GROUP} retention"
    ]  # fmt: skip
    assert any("it asked the family groups train, held_out, this run held_out: its rows hold "
               "the groups both asked" in note for note in notes)  # fmt: skip


def test_recall_report_only_rewrites_recall_md_with_kvpress(tmp_path, capsys):
    results = _recall_results(memory=[1.0, 1.0, 1.0, 0.0])
    (tmp_path / "recall.json").write_text(json.dumps(results))
    (tmp_path / "kvpress_recall.json").write_text(json.dumps(_kvpress_recall([0.0] * 4)))
    args = argparse.Namespace(
        out=str(tmp_path), report_only=True, recall=True, no_plots=True, resume=False
    )
    assert eval_command(args) == 0
    assert "| kvpress snapkv @ 88% | 0.0 [" in (tmp_path / "recall.md").read_text()
    assert json.loads((tmp_path / "recall.json").read_text()) == results
    missing = argparse.Namespace(out=str(tmp_path / "none"), report_only=True, recall=True,
                                 no_plots=True, resume=False)  # fmt: skip
    with pytest.raises(FileNotFoundError, match="run kvpop-compile eval --recall without"):
        eval_command(missing)


KVPRESS_PYTHON = Path(__file__).resolve().parents[2] / ".venv-kvpress" / "bin" / "python"


@pytest.mark.skipif(
    not KVPRESS_PYTHON.exists(),
    reason="needs kvpress's venv (.venv-kvpress, made by benchmarks/kvpress_eval.py on first use)",
)
def test_worker_full_attention_answers_like_the_project(tmp_path):
    """The real worker, with no press, gives the project's greedy answers in both protocols;
    a press it does not know is recorded as an error."""
    groups = recall_groups(("lookup",), (1024,), 2, families=("held_out",))
    job = recall_job(groups, ("prefill", "decode"), max_positions=2048, batch=2)
    for part in job["groups"]:
        part["stretch"] = 8  # a short stretch keeps the test quick
    job.update(model=str(EMBEDDED_MODEL), presses=["none", "bogus"])
    result = summarise_recall(run_worker(KVPRESS_PYTHON, job, tmp_path), groups)
    model = load_embedded_model()
    items = groups["held_out/lookup@1024"]
    for protocol, stretch in (("prefill", 0), ("decode", 8)):
        ours = answer_exactly(model, items, protocol, stretch)
        assert result["results"]["none"]["0%"][protocol] == {"held_out/lookup@1024": ours}
    assert result["results"]["bogus"]["75%"]["prefill"]["error"].startswith("ValueError: unknown")
