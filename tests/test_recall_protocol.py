"""The recall protocol: exact match of greedy answers, both ways of asking, and its report."""

import copy
import dataclasses
import json

import pytest
import torch

from kvpop_compile import transform
from kvpop_compile.embedded import load_embedded_model
from kvpop_compile.embedded.corpus import encode
from kvpop_compile.embedded.recall import RecallItem, recall_items
from kvpop_compile.evaluation.fingerprints import items_sha256
from kvpop_compile.evaluation.methods import (
    Method,
    budget_config,
    method_notes,
    methods,
    scorer_folder,
)
from kvpop_compile.evaluation.protocols import greedy_continuation
from kvpop_compile.evaluation.recall import (
    RecallSettings,
    answer_exactly,
    answer_probability,
    decode_stretch,
    recall_settings_record,
    run_recall,
)
from kvpop_compile.evaluation.recall_report import (
    evaluate_recall,
    recall_document,
    recall_targets,
    resumable_methods,
    summarize_recall,
)
from kvpop_compile.scorer_io import tensors_sha256


@pytest.fixture(scope="module")
def model():
    return load_embedded_model()


def _with_answer(item: RecallItem, answer: bytes) -> RecallItem:
    return dataclasses.replace(item, answer=answer)


def test_exact_match_is_every_answer_byte(model):
    """An item whose answer is the model's own greedy continuation scores 1; changing one byte
    of it scores 0."""
    items = recall_items("held_out", "lookup", 1024, 2, 0)
    greedy = greedy_continuation(model, torch.stack([encode(i.prompt) for i in items]), 4).tokens
    own = [_with_answer(i, bytes(t.tolist())) for i, t in zip(items, greedy, strict=True)]
    assert answer_exactly(model, own, "prefill") == [1.0, 1.0]
    wrong = bytearray(own[1].answer)
    wrong[-1] = (wrong[-1] + 1) % 256
    assert answer_exactly(model, [own[0], _with_answer(own[1], bytes(wrong))], "prefill") == [
        1.0,
        0.0,
    ]
    # Asked after no stretch, the question is the same prompt fed in two parts.
    assert answer_exactly(model, own, "decode", stretch=0) == [1.0, 1.0]


def test_answer_probability_is_the_teacher_forced_product_of_the_answer_tokens(model):
    """Under full attention, the answer's probability is the product of its tokens'
    probabilities in one forward pass over prompt + answer; a cache that never evicts gives the
    same, asked either way (decode after no stretch is the same prompt fed in two parts)."""
    items = recall_items("held_out", "call", 1024, 2, 0)
    answer_length = len(items[0].answer)
    ids = torch.stack([encode(i.prompt + i.answer) for i in items])  # (B, P + A)
    with torch.no_grad():
        log_probs = model(input_ids=ids).logits.float().log_softmax(dim=-1)
    predicted = log_probs[:, -answer_length - 1 : -1]  # positions that predict the answer
    answers = ids[:, -answer_length:]
    expected = predicted.gather(-1, answers.unsqueeze(-1)).squeeze(-1).sum(dim=1).exp()
    full = answer_probability(model, items, "prefill")
    torch.testing.assert_close(
        torch.tensor(full, dtype=torch.float64), expected.double(), rtol=1e-4, atol=1e-6
    )
    bounded = transform(copy.deepcopy(model), budget_config("window", 2048))  # evicts nothing
    for protocol in ("prefill", "decode"):
        torch.testing.assert_close(
            answer_probability(bounded, items, protocol), full, rtol=1e-4, atol=1e-6
        )
    # A wrong last byte: its probability is that of a token the greedy answer did not pick.
    assert answer_exactly(model, items, "prefill") == [1.0, 1.0]
    wrong = bytearray(items[0].answer)
    wrong[-1] = (wrong[-1] + 1) % 256
    lowered = answer_probability(model, [_with_answer(items[0], bytes(wrong)), items[1]], "prefill")
    assert lowered[0] < full[0] and lowered[1] == pytest.approx(full[1], rel=1e-5)


def test_a_budget_that_holds_everything_answers_like_full_attention(model):
    """Capacity 2048 >= the item's 1024 + 1024 stretch tokens: the bounded cache never evicts,
    so both protocols give full attention's answers (invariant 1)."""
    items = recall_items("held_out", "chain", 1024, 3, 0)
    bounded = transform(copy.deepcopy(model), budget_config("window", 2048))
    for protocol, stretch in (("prefill", 0), ("decode", 64)):
        assert answer_exactly(bounded, items, protocol, stretch) == answer_exactly(
            model, items, protocol, stretch
        )


def test_decode_stretch_fits_the_positions():
    assert decode_stretch(1024, 2048) == 1024
    assert decode_stretch(2048, 2048) == 0
    assert decode_stretch(512, 4096) == 512
    assert decode_stretch(1024, 2048, cap=16) == 16


def test_run_recall_reports_every_group_and_method(model, tmp_path):
    settings = RecallSettings(
        tasks=("lookup",), lengths=(1024, 2048), items=2, batch=2, max_stretch=16
    )
    methods = [Method(None, None), Method("window", "88%")]
    results = evaluate_recall(model, tmp_path, methods=methods, settings=settings,
                              progress=False)  # fmt: skip
    record = results["methods"]["window @ 88%"]
    assert set(record["prefill"]) == {"lookup@1024", "lookup@2048"}
    assert set(record["decode"]) == {"lookup@1024"}  # no room for a stretch at 2048
    assert results["stretch"] == {"1024": 16, "2048": 0}
    assert all(len(v) == 2 and set(v) <= {0.0, 1.0} for v in record["prefill"].values())
    summary = summarize_recall(results)
    assert 0.0 <= summary["full"]["prefill"]["lookup@1024"].value <= 1.0
    assert (tmp_path / "recall.json").is_file()
    report = (tmp_path / "recall.md").read_text()
    assert "lookup@1024" in report and "by length: 1024: 16, 2048: 0" in report
    prefill_only = recall_document({**results, "protocols": ["prefill"]})
    assert "the decode protocol was not run" in prefill_only and "by length" not in prefill_only
    with pytest.raises(ValueError, match="protocols must be among prefill, decode"):
        run_recall(model, methods, settings=RecallSettings(protocols=("later",)))


def test_a_cut_off_run_resumes_where_it_stopped(model, tmp_path):
    """recall.json is saved after every method; ``resume`` keeps what it holds and runs only the
    missing methods, and other policies add rows to the saved run."""
    settings = RecallSettings(tasks=("lookup",), lengths=(1024,), items=2, batch=2,
                              protocols=("prefill",))  # fmt: skip
    full, window = Method(None, None), Method("window", "88%")
    memory = methods(["memory"], ["88%"])[1]  # at the window its shipped scorer was saved with
    # The memory scorer is missing from this root: the run stops at its third method.
    with pytest.raises(FileNotFoundError, match="no trained memory scorer"):
        evaluate_recall(model, tmp_path, methods=[full, window, memory], settings=settings,
                        scorer_root=tmp_path / "no-scorers", progress=False)  # fmt: skip
    saved = json.loads((tmp_path / "recall.json").read_text())
    assert list(saved["methods"]) == ["full", "window @ 88%"]
    # Mark the saved window row, so that a rerun would show.
    saved["methods"]["window @ 88%"]["prefill"]["lookup@1024"] = [1.0, 0.5]
    (tmp_path / "recall.json").write_text(json.dumps(saved))
    results = evaluate_recall(model, tmp_path, methods=[full, memory, Method("random", "75%")],
                              settings=settings, progress=False, resume=True)  # fmt: skip
    assert list(results["methods"]) == ["full", "random @ 75%", "memory @ 88%", "window @ 88%"]
    assert results["methods"]["window @ 88%"]["prefill"]["lookup@1024"] == [1.0, 0.5]
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
    assert fresh["methods"]["window @ 88%"]["prefill"]["lookup@1024"] != [1.0, 0.5]
    with pytest.raises(ValueError, match="include 'full' among the methods"):
        run_recall(model, [window], settings=settings)


def test_a_priority_span_is_recorded_and_never_mixed_into_a_resumed_run(model):
    spread = methods(["memory", "h2o"], ["88%"], priority_span=3)
    assert [(m.name, m.priority_span) for m in spread] == [
        ("full", 0), ("memory @ 88%", 3), ("h2o @ 88%", 0),  # a heuristic runs as published
    ]  # fmt: skip
    # (the shipped memory-256 scorer was saved with a 96-token window, which the row records)
    assert spread[1].record() == {
        "policy": "memory", "budget": "88%", "priority_span": 3, "window": 96,
    }  # fmt: skip
    assert spread[2].record() == {"policy": "h2o", "budget": "88%"}  # as files without spans
    assert method_notes({m.name: m.record() for m in spread})[0] == (
        "priority_span (each token's score spread over the tokens that leave the window after "
        "it): memory @ 88% 3, the span each trained scorer was saved with unless the run asked "
        "for one; full attention and the heuristic policies run without it"
    )
    # Methods with their own spans are each named with theirs.
    own = {"memory @ 75%": {"priority_span": 6}, "mlp @ 75%": {"priority_span": 10}}
    assert "): memory @ 75% 6, mlp @ 75% 10, the span" in method_notes(own)[0]
    assert method_notes({m.name: m.record() for m in methods(["h2o"], ["88%"])}) == []
    saved = {"full": {"policy": None, "budget": None}, "memory @ 88%": spread[1].record()}
    settings = RecallSettings(tasks=("lookup",), lengths=(1024,), items=1, protocols=("prefill",))
    with pytest.raises(ValueError, match="cannot resume memory @ 88%: it was run with "
                       "priority_span 3, this run asks 0"):  # fmt: skip
        run_recall(model, methods(["memory"], ["88%"]), settings=settings, done=saved)
    # Nor one run at another window (a scorer saved with a wider one).
    saved["memory @ 88%"] = {"policy": "memory", "budget": "88%", "window": 128}
    with pytest.raises(ValueError, match="cannot resume memory @ 88%: it was run with "
                       "window 128, this run asks 96"):  # fmt: skip
        run_recall(model, methods(["memory"], ["88%"]), settings=settings, done=saved)
    # A row measured with another trained scorer is not this run's either.
    saved["memory @ 88%"] = {
        "policy": "memory", "budget": "88%", "window": 96, "scorer_sha256": "0" * 64,
    }  # fmt: skip
    with pytest.raises(ValueError, match="cannot resume memory @ 88%: it was run with "
                       f"scorer_sha256 {'0' * 64}"):  # fmt: skip
        run_recall(model, methods(["memory"], ["88%"]), settings=settings, done=saved)


def test_the_settings_record_fingerprints_the_items_asked():
    settings = RecallSettings(tasks=("chain",), lengths=(1024,), items=2)
    record = recall_settings_record(settings, 2048)
    digest = items_sha256(recall_items("held_out", "chain", 1024, 2, settings.seed))
    assert record["items_sha256"] == digest
    other = recall_settings_record(dataclasses.replace(settings, seed=7), 2048)
    assert other["items_sha256"] != digest


def test_resume_refuses_a_run_with_other_settings():
    saved = {"items": 2, "tasks": ["lookup"], "lengths": [1024], "protocols": ["prefill"],
             "stretch": {"1024": 0}, "model": "m", "methods": {"full": {}}}  # fmt: skip
    expected = {k: v for k, v in saved.items() if k != "methods"}
    assert resumable_methods(saved, {**expected, "seed": 0}) == {"full": {}}  # seed 0 by default
    with pytest.raises(ValueError, match="was run with items 2, this run asks items 3"):
        resumable_methods(saved, {**expected, "items": 3})
    with pytest.raises(ValueError, match="was run with model 'm', this run asks model 'other'"):
        resumable_methods(saved, {**expected, "model": "other"})


def test_decode_targets_are_judged_at_the_length_the_decode_protocol_ran():
    # The decode protocol fits only shorter items (the stretch needs positions): memory's
    # targets there are judged at 1024 bytes; full attention's 90% stays a 2048-byte target.
    items = {"prefill": {"lookup@2048": [1.0] * 4}, "decode": {"lookup@1024": [1.0] * 4}}
    results = {
        "protocols": ["prefill", "decode"],
        "methods": {
            "full": items,
            "memory @ 88%": {"prefill": {"lookup@2048": [1.0, 1.0, 1.0, 0.0]},
                             "decode": {"lookup@1024": [1.0, 1.0, 0.0, 0.0]}},
            "window @ 88%": {"prefill": {"lookup@2048": [0.0] * 4},
                             "decode": {"lookup@1024": [0.0] * 4}},
        },
    }  # fmt: skip
    lines = recall_targets(results, summarize_recall(results))
    assert "- full attention ≥ 90% on lookup@2048 (prefill): met — 100.0%" in lines
    assert not any("full attention ≥ 90% on lookup@1024" in line for line in lines)
    assert (
        "- `memory` at 88% keeps ≥ 90% of full attention on lookup@1024 retention (decode): "
        "missed — 50.0% (95% interval 0.0-100.0%)" in lines
    )
    assert any("best heuristic on lookup@1024 (decode): met — 50.0%" in line for line in lines)
    # Prefill at 1024 bytes alone has no target to judge, and the report says so.
    short = {"protocols": ["prefill"], "items": 4, "lengths": [1024], "stretch": {"1024": 0},
             "methods": {name: {"prefill": {"lookup@1024": record["prefill"]["lookup@2048"]}}
                         for name, record in results["methods"].items()}}  # fmt: skip
    assert recall_targets(short, summarize_recall(short)) == []
    assert "- none at these lengths: the targets are at 2048 bytes" in recall_document(short)


def test_a_retention_target_prints_the_interval_of_paired_draws():
    # The same draws of items for both methods: a policy that answers exactly the items full
    # attention answers keeps 100% in every draw, however many items both miss; drawn
    # separately, the two accuracies would scatter and widen the interval.
    answered = [1.0] * 48 + [0.0] * 16
    one_more_miss = [0.0] + answered[1:]
    results = {
        "protocols": ["prefill"],
        "methods": {
            "full": {"prefill": {"chain@2048": answered}},
            "memory @ 75%": {"prefill": {"chain@2048": answered}},
            "memory @ 88%": {"prefill": {"chain@2048": one_more_miss}},
        },
    }
    lines = recall_targets(results, summarize_recall(results))
    assert (
        "- `memory` at 75% keeps ≥ 95% of full attention on chain@2048 retention (prefill): "
        "met — 100.0% (95% interval 100.0-100.0%)" in lines
    )
    (line,) = [line for line in lines if "at 88% keeps" in line]
    low, high = (float(x) for x in line.split("interval ")[1].rstrip("%)").split("-"))
    assert line.startswith("- `memory` at 88% keeps ≥ 90% of full attention on chain@2048")
    assert "met — 97.9%" in line  # 47 of full attention's 48
    assert 90.0 < low < 97.9 <= high <= 100.0
