"""The recall protocol: exact match of greedy answers, both ways of asking, items of mixed
shapes, family groups, and a run's results and settings record."""

import copy
import dataclasses
import re

import pytest
import torch
from tiny_models import tiny_qwen3

import kvpop_compile as kc
from kvpop_compile import transform
from kvpop_compile.embedded import load_embedded_model
from kvpop_compile.embedded.corpus import encode
from kvpop_compile.embedded.recall import RecallItem, recall_items
from kvpop_compile.evaluation.methods import (
    WINDOW,
    Method,
    budget_config,
    build_model,
    method_notes,
    methods,
    scorer_folder,
)
from kvpop_compile.evaluation.protocols import greedy_continuation, model_cache
from kvpop_compile.evaluation.recall.protocol import (
    RecallSettings,
    answer_exactly,
    answer_probability,
    batches,
    decode_stretch,
    feed_tokens,
    greedy_answers,
    group_key,
    recall_groups,
    recall_settings_record,
    run_recall,
    split_group_key,
)
from kvpop_compile.evaluation.recall.report import (
    evaluate_recall,
    recall_document,
    summarize_recall,
)
from kvpop_compile.fingerprints import items_sha256
from kvpop_compile.scorer_io import saved_config


@pytest.fixture(scope="module")
def model():
    return load_embedded_model()


def _with_answer(item: RecallItem, answer: bytes) -> RecallItem:
    return dataclasses.replace(item, answer=answer)


def test_exact_match_is_every_answer_byte(model):
    """An item whose answer is the model's own greedy continuation scores 1; changing one byte
    of it scores 0."""
    own = _own_answers(model, recall_items("held_out", "lookup", 1024, 2, 0))
    assert answer_exactly(model, own, "prefill") == [1.0, 1.0]
    wrong = bytearray(own[1].answer)
    wrong[-1] = (wrong[-1] + 1) % 256
    assert answer_exactly(model, [own[0], _with_answer(own[1], bytes(wrong))], "prefill") == [
        1.0,
        0.0,
    ]
    # Asked after no stretch, the question is the same prompt fed in two parts.
    assert answer_exactly(model, own, "decode", stretch=0) == [1.0, 1.0]


def _own_answers(model, items: list[RecallItem]) -> list[RecallItem]:
    """``items`` with each answer replaced by the model's own greedy continuation of as many
    bytes, asked alone (so their shapes stay the items' own)."""
    own = []
    for item in items:
        tokens = greedy_continuation(model, encode(item.prompt)[None], len(item.answer)).tokens
        own.append(_with_answer(item, bytes(tokens[0].tolist())))
    return own


def test_answer_probability_is_the_teacher_forced_product_of_the_answer_tokens(model):
    """Under full attention, the answer's probability is the product of its tokens'
    probabilities in one forward pass over prompt + answer; a cache that never evicts gives the
    same, asked either way (decode after no stretch is the same prompt fed in two parts). The
    items' answers differ in length, and are asked in one batch."""
    items = _own_answers(model, recall_items("held_out", "chain", 1024, 2, 0, families="held_out"))
    assert len({len(i.answer) for i in items}) == 2
    ids = torch.stack([encode(i.prompt + i.answer) for i in items])  # (B, 1024)
    with torch.no_grad():
        log_probs = model(input_ids=ids).logits.float().log_softmax(dim=-1)
    expected = []
    for row, item in enumerate(items):
        n = len(item.answer)
        predicted = log_probs[row, -n - 1 : -1]  # the positions that predict the answer
        expected.append(predicted.gather(-1, ids[row, -n:, None]).sum().exp().item())
    full = answer_probability(model, items, "prefill")
    torch.testing.assert_close(
        torch.tensor(full, dtype=torch.float64),
        torch.tensor(expected, dtype=torch.float64),
        rtol=1e-4,
        atol=1e-6,
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


def _question_moved(item: RecallItem, by: int) -> RecallItem:
    """``item`` with its prompt's last newline ``by`` bytes earlier: the same prompt and answer
    lengths, a question ``by`` bytes longer (so the decode protocol cuts it elsewhere)."""
    cut = item.prompt.rindex(b"\n")
    prompt = item.prompt[: cut - by] + b"\n" + item.prompt[cut - by : cut] + item.prompt[cut + 1 :]
    return dataclasses.replace(item, prompt=prompt)


def _flipped(item: RecallItem) -> RecallItem:
    wrong = bytearray(item.answer)
    wrong[-1] = (wrong[-1] + 1) % 256
    return _with_answer(item, bytes(wrong))


def _answer_alone(model, item: RecallItem, protocol: str, stretch: int) -> bytes:
    """The greedy answer to ``item`` asked alone, each protocol written out plainly: the prompt
    (to decode: up to the question line, ``stretch`` greedy tokens, then the question) as
    chunks, then one greedy token at a time."""
    ids = encode(item.prompt)[None]  # (1, P)
    cache = model_cache(model)
    if protocol == "prefill":
        logits = feed_tokens(model, ids, cache)
    else:
        cut = len(item.prompt) - len(item.question) + 1  # the question's newline enters first
        logits = feed_tokens(model, ids[:, :cut], cache)
        for _ in range(stretch):
            logits = feed_tokens(model, logits.argmax(dim=-1, keepdim=True), cache)
        logits = feed_tokens(model, ids[:, cut:], cache)
    answer = []
    for _ in item.answer:
        answer.append(int(logits.argmax(dim=-1)))
        logits = feed_tokens(model, torch.tensor([[answer[-1]]]), cache)
    return bytes(answer)


@pytest.mark.parametrize("bounded", [False, True])
@pytest.mark.parametrize(("protocol", "stretch"), [("prefill", 0), ("decode", 6), ("decode", 40)])
def test_items_of_different_shapes_in_one_call_score_as_each_asked_alone(
    bounded, protocol, stretch
):
    """Items of different prompt, question and answer lengths, in one call: each batch
    left-pads its prompts to the longest, and every item scores what it scores asked alone, in
    the order given, whatever the batch limit. Each item's answer is its greedy answer asked
    alone by a plain writing-out of the protocol (exact: 1) or that answer with its last byte
    changed (0), and the same item appears with both, in one batch."""
    # In float64: a random model's keys have near-ties in norm, which float32 rounding of a
    # chunk against a step (or of one batch against another) can order either way.
    model = tiny_qwen3(seed=3, dtype=torch.float64)
    if bounded:  # capacity 32: every item evicts, and the stretch evicts again
        model = kc.transform(model, kc.KVpopConfig(sinks=2, window=8, topk=22, scorer="knorm"))
    base = recall_items("held_out", "lookup", 256, 2, 0, families="held_out")
    base += recall_items("held_out", "lookup", 256, 1, 0, families="train")
    base.append(_question_moved(base[-1], by=3))  # the shape of base[2] but for its question
    base += recall_items("held_out", "lookup", 512, 1, 0, families="train")
    own = [_with_answer(i, _answer_alone(model, i, protocol, stretch)) for i in base]
    for lengths in ([len(i.answer) for i in own], [len(i.question) for i in own]):
        assert len(set(lengths)) > 1
    assert len({len(i.prompt) for i in own}) > 2  # 256-byte items differ too
    items = [own[0], _flipped(own[2]), own[3], own[4], _flipped(own[0]), own[1], own[2]]
    expected = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    for batch in (None, 1, 4):
        assert answer_exactly(model, items, protocol, stretch, batch) == expected
    tokens, _ = greedy_answers(model, own, protocol, stretch)
    assert tokens.shape == (len(own), max(len(i.answer) for i in own))
    for row, item in enumerate(own):  # each row's answer, whatever the longest one
        assert bytes(tokens[row, : len(item.answer)].tolist()) == item.answer
    alone = [answer_probability(model, [item], protocol, stretch)[0] for item in items]
    together = answer_probability(model, items, protocol, stretch)
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-9)
    with pytest.raises(ValueError, match="items must hold at least one RecallItem, got none"):
        greedy_answers(model, [], protocol, stretch)


def test_batches_cut_items_in_order():
    assert batches(list("abcde"), 2) == [[0, 1], [2, 3], [4]]
    assert batches(list("abc")) == [[0, 1, 2]]
    assert batches([], 3) == []
    with pytest.raises(ValueError, match="batch must be an integer >= 1, got 0"):
        batches(list("ab"), 0)


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


def test_run_recall_reports_every_family_group_task_and_length(model, tmp_path):
    settings = RecallSettings(
        tasks=("lookup",), lengths=(1024, 2048), items=2, batch=2, max_stretch=16
    )
    methods = [Method(None, None), Method("window", "88%")]
    results = evaluate_recall(model, tmp_path, methods=methods, settings=settings,
                              progress=False)  # fmt: skip
    record = results["methods"]["window @ 88%"]
    assert set(record["prefill"]) == {
        "train/lookup@1024", "train/lookup@2048", "held_out/lookup@1024", "held_out/lookup@2048",
    }  # fmt: skip
    # no room for a stretch at 2048
    assert set(record["decode"]) == {"train/lookup@1024", "held_out/lookup@1024"}
    assert results["families"] == ["train", "held_out"]
    assert results["stretch"] == {"1024": 16, "2048": 0}
    assert all(len(v) == 2 and set(v) <= {0.0, 1.0} for v in record["prefill"].values())
    # Each group's marks are those of its own items.
    groups = recall_groups(settings)
    window = build_model(model, Method("window", "88%"))
    held_out = groups[("held_out", "lookup", 2048)]
    assert all(i.families == "held_out" for i in held_out)
    assert record["prefill"]["held_out/lookup@2048"] == answer_exactly(window, held_out, "prefill")
    summary = summarize_recall(results)
    assert 0.0 <= summary["full"]["prefill"]["held_out/lookup@1024"].value <= 1.0
    assert (tmp_path / "recall.json").is_file()
    report = (tmp_path / "recall.md").read_text()
    for title in (
        "prefill protocol, trained families",
        "prefill protocol, held-out families",
        "decode protocol, trained families",
        "decode protocol, held-out families",
    ):
        assert f"### {title}: exact match %" in report
    assert "by length: 1024: 16, 2048: 0" in report
    assert "2 items of held-out code per family group, task and length (1024, 2048 bytes)" in report
    prefill_only = recall_document({**results, "protocols": ["prefill"]})
    assert "the decode protocol was not run" in prefill_only and "by length" not in prefill_only
    with pytest.raises(ValueError, match="protocols must be among prefill, decode"):
        run_recall(model, methods, settings=RecallSettings(protocols=("later",)))


def test_a_group_is_named_by_family_group_task_and_length():
    assert group_key("held_out", "multi_key", 2048) == "held_out/multi_key@2048"
    assert split_group_key("held_out/multi_key@2048") == ("held_out", "multi_key@2048")
    assert split_group_key("multi_key@2048") == (None, "multi_key@2048")


def test_recall_groups_ask_each_family_group_of_held_out_code():
    settings = RecallSettings(tasks=("chain", "lookup"), lengths=(1024,), items=2,
                              families=("held_out", "validation"), seed=5)  # fmt: skip
    groups = recall_groups(settings)
    assert list(groups) == [
        ("held_out", "chain", 1024), ("held_out", "lookup", 1024),
        ("validation", "chain", 1024), ("validation", "lookup", 1024),
    ]  # fmt: skip
    for (families, task, length), items in groups.items():
        assert items == recall_items("held_out", task, length, 2, 5, families=families)
    assert RecallSettings().families == ("train", "held_out")  # never validation by default


@pytest.mark.parametrize(
    ("families", "error", "message"),
    [
        (("heldout",), ValueError, r"families must be distinct members of \('train', "
         r"'validation', 'held_out'\), at least one; got \('heldout',\) \(unknown \['heldout'\]\)"),
        (("train", "train"), ValueError, r"got \('train', 'train'\) \(repeated \['train'\]\)"),
        ((), ValueError, r"at least one; got \(\) \(none\)"),
        ("train", TypeError, "families must be a tuple of .*, got 'train'"),
    ],
)  # fmt: skip
def test_recall_settings_refuse_bad_family_groups(families, error, message):
    with pytest.raises(error, match=message):
        RecallSettings(families=families)


def test_a_priority_span_is_recorded_and_never_mixed_into_a_resumed_run(model):
    spread = methods(["memory", "h2o"], ["88%"], priority_span=3)
    assert [(m.name, m.priority_span) for m in spread] == [
        ("full", 0), ("memory @ 88%", 3), ("h2o @ 88%", 0),  # a heuristic runs as published
    ]  # fmt: skip
    # (the shipped memory-256 scorer was saved with its own window and lam, which the row
    # records)
    shipped = saved_config(scorer_folder("memory", 256))
    assert (shipped.window, shipped.lam) != (WINDOW, 0.0)
    assert spread[1].record() == {
        "policy": "memory", "budget": "88%", "priority_span": 3, "window": list(shipped.window),
        "lam": shipped.lam, "topk": list(shipped.topk),
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
    settings = RecallSettings(tasks=("lookup",), lengths=(1024,), items=1, protocols=("prefill",),
                              families=("train",))  # fmt: skip
    with pytest.raises(ValueError, match="cannot resume memory @ 88%: it was run with "
                       "priority_span 3, this run asks 0"):  # fmt: skip
        run_recall(model, methods(["memory"], ["88%"]), settings=settings, done=saved)
    # Nor one run at another window (a scorer saved with a wider one).
    saved["memory @ 88%"] = {"policy": "memory", "budget": "88%", "window": 128}
    with pytest.raises(ValueError, match=re.escape("cannot resume memory @ 88%: it was run "
                       f"with window 128, this run asks {list(shipped.window)}")):  # fmt: skip
        run_recall(model, methods(["memory"], ["88%"]), settings=settings, done=saved)
    # A row measured with another trained scorer is not this run's either.
    saved["memory @ 88%"] = {
        "policy": "memory", "budget": "88%", "window": list(shipped.window),
        "lam": shipped.lam, "topk": list(shipped.topk), "scorer_sha256": "0" * 64,
    }  # fmt: skip
    with pytest.raises(ValueError, match="cannot resume memory @ 88%: it was run with "
                       f"scorer_sha256 {'0' * 64}"):  # fmt: skip
        run_recall(model, methods(["memory"], ["88%"]), settings=settings, done=saved)


def test_the_settings_record_fingerprints_the_items_asked_and_names_the_family_groups():
    settings = RecallSettings(tasks=("chain",), lengths=(1024,), items=2)
    record = recall_settings_record(settings, 2048)
    asked = [recall_items("held_out", "chain", 1024, 2, settings.seed, families=families)
             for families in ("train", "held_out")]  # fmt: skip
    assert record["families"] == ["train", "held_out"]
    assert record["items_sha256"] == items_sha256(asked[0] + asked[1])
    other = recall_settings_record(dataclasses.replace(settings, seed=7), 2048)
    assert other["items_sha256"] != record["items_sha256"]
    trained = recall_settings_record(dataclasses.replace(settings, families=("train",)), 2048)
    assert trained["families"] == ["train"] and trained["items_sha256"] == items_sha256(asked[0])


def test_greedy_continuations_name_the_prompt_they_refuse():
    from kvpop_compile.evaluation.recall.protocol import greedy_continuations

    model = tiny_qwen3()
    good = torch.tensor([1, 2, 3])
    with pytest.raises(ValueError, match="prompts must hold at least one prompt, got none"):
        greedy_continuations(model, [], 2)
    with pytest.raises(TypeError, match=r"prompts\[1\] must be a tensor of token ids, got list"):
        greedy_continuations(model, [good, [1, 2]], 2)
    with pytest.raises(ValueError, match=r"prompts\[1\] must be a non-empty 1-D .* shape \(1, 2\)"):
        greedy_continuations(model, [good, torch.tensor([[1, 2]])], 2)
    with pytest.raises(ValueError, match="steps must be an integer >= 1, got 0"):
        greedy_continuations(model, [good], 0)
