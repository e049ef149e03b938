"""The README's main command: ``kvpop-compile demo`` on the embedded model."""

import dataclasses

import pytest

from kvpop_compile.cli import main
from kvpop_compile.config import KVpopConfig
from kvpop_compile.embedded.recall import TASKS, recall_items
from kvpop_compile.evaluation.demo.run import Contender, budget_sentence, run_demo
from kvpop_compile.evaluation.methods import WINDOW, scorer_folder
from kvpop_compile.evaluation.recall.protocol import RECALL_SEED
from kvpop_compile.runtime.cache import BoundedCacheState
from kvpop_compile.scorer_io import saved_config


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    image = tmp_path_factory.mktemp("demo") / "kept.png"
    return run_demo(items=1, context=1024, image=image, progress=False)


def test_demo_measures_three_caches_and_shows_one_item_consistently(result):
    labels = [c.label for c in result.contenders]
    assert labels == ["full attention", "KVpop, trained memory scorer", "window (heuristic)"]
    # Items of held-out code in held-out families: syntaxes no model or scorer trained on.
    assert result.items == [
        recall_items("held_out", task, 1024, 1, RECALL_SEED, families="held_out")[0]
        for task in TASKS
    ]
    assert all(len(marks) == len(TASKS) for marks in result.exact.values())
    example = result.example
    # The example is answered again alone: its answers agree with the measured marks.
    for label in labels:
        right = example.answers[label] == example.item.answer
        assert right == bool(result.exact[label][example.index])
    full, kvpop, window = (result.exact[label] for label in labels)
    separating = [i for i in range(len(TASKS)) if full[i] and kvpop[i] and not window[i]]
    if separating:
        assert example.index == separating[0]
    # A bounded cache holds its fixed buffers whatever the context (each layer's empty state,
    # scorer state included); full attention's holds the whole prompt.
    sizes = example.cache_bytes
    for contender in result.contenders[1:]:
        layers = contender.model.model.layers
        empty = [
            BoundedCacheState.empty(contender.config.layer(i), layer.self_attn.scorer, batch=1,
                                    head_dim=contender.model.config.head_dim).nbytes
            for i, layer in enumerate(layers)
        ]  # fmt: skip
        assert sizes[contender.label] == sum(empty)
    assert sizes["full attention"] > sizes[labels[1]] > sizes[labels[2]]
    evidence = [example.item.prompt[start:end] for start, end in example.item.evidence]
    value = example.item.prompt[slice(*example.item.value_span)]
    assert example.item.answer.endswith(value) and value in evidence[0]
    report = "\n".join(result.report())
    assert f"the answer follows from {evidence[0].decode().strip()!r}" in report
    assert (
        f"({example.item.task}, {example.item.family} syntax, {example.item.alphabet} values;"
        in (report)
    )
    assert f"  ...{example.item.question[1:].decode()!r} -> expected" in report
    assert "in held-out families" in report
    # The shipped scorer's own per-layer budget, span and recency term; the heuristic runs as
    # published (no spread, no recency term), with the same memory in every layer.
    shipped = saved_config(scorer_folder("memory", 256))
    assert (shipped.lam, shipped.priority_span) != (0.0, 0) and shipped.per_layer == 4
    kvpop, heuristic = (c.config for c in result.contenders[1:])
    assert kvpop == shipped
    assert heuristic == dataclasses.replace(shipped, scorer="window", priority_span=0, lam=0.0,
                                            window=WINDOW, topk=256 - 4 - WINDOW)  # fmt: skip
    capacities = ", ".join(map(str, shipped.capacities))
    windows = ", ".join(map(str, shipped.window))
    assert (
        "Bounded caches hold the same memory (75% compression): KVpop, trained memory scorer: a "
        f"per-layer budget of {capacities} tokens per KV head in layers 0 to 3 (4 sinks, windows "
        f"{windows}, the rest pool); window (heuristic): 4 sinks + {WINDOW} window + "
        f"{256 - 4 - WINDOW} pool = 256 tokens per layer and KV head." in report
    )
    assert (
        f"KVpop spreads each score over the {shipped.priority_span} tokens that leave the window"
        in report
    )
    assert f"KVpop's priority rises by {shipped.lam:g} per position" in report
    for label in labels:
        right, total = result.accuracy(label)
        assert (right, total) == (sum(result.exact[label]), len(TASKS))
        (row,) = [line for line in report.splitlines() if line.startswith(label)]
        assert row.split()[-2:] == [f"{right}/{total}", f"{right / total:.0%}"]
    assert result.image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_budget_sentence_names_one_budget_once_and_different_memory_apart():
    one = KVpopConfig(sinks=4, window=16, topk=44)
    same = [Contender("a", None, one), Contender("b", None, dataclasses.replace(one, scorer="h2o"))]
    assert budget_sentence([Contender("full", None, None), *same], 240) == (
        "Bounded caches keep 4 sinks + 16 window + 44 pool = 64 tokens per layer and KV head "
        "(73% compression)."
    )
    wider = Contender("c", None, dataclasses.replace(one, topk=(44, 108)))
    assert budget_sentence([same[0], wider], 256) == (
        "Bounded caches keep a: 4 sinks + 16 window + 44 pool = 64 tokens per layer and KV head "
        "(75% compression); c: a per-layer budget of 64, 128 tokens per KV head in layers 0 to 1 "
        "(4 sinks, windows 16, 16, the rest pool) (62% compression)."
    )


def test_a_per_layer_scorer_the_baseline_cannot_match_is_refused(tmp_path):
    from kvpop_compile import save_scorer, transform
    from kvpop_compile.embedded import load_embedded_model
    from kvpop_compile.evaluation.demo.run import prepare

    shipped = saved_config(scorer_folder("memory", 256))
    for topk, average in (((20, 20, 20, 23), r"\[32, 32, 32, 35\]"),
                          ((20, 20, 20, 20), r"\[32, 32, 32, 32\]")):  # fmt: skip
        config = dataclasses.replace(shipped, window=(8,) * 4, topk=topk)
        save_scorer(transform(load_embedded_model(), config), tmp_path / "scorer")
        with pytest.raises(ValueError, match=f"per-layer budget of {average} slots; the baseline "
                                             "keeps their average in every layer"):  # fmt: skip
            prepare(scorer=tmp_path / "scorer")


def test_cli_rejects_bad_arguments(capsys):
    with pytest.raises(SystemExit, match="2"):
        main(["demo", "--items", "0"])  # refused as it is parsed
    assert "argument --items: must be an integer >= 1, got '0'" in capsys.readouterr().err
    assert main(["demo", "--context", "4096"]) == 2
    assert "context must be one of (1024, 2048), got 4096" in capsys.readouterr().err
    assert main(["demo", "--policy", "lru"]) == 2
    assert "scorer must be one of" in capsys.readouterr().err
    assert main(["demo", "--policy", "mlp"]) == 2
    assert "--policy mlp is learned; the baseline is a heuristic" in capsys.readouterr().err
    assert main(["demo", "--capacity", "300"]) == 2
    assert "no shipped memory scorer for capacity 300" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="2"):
        main(["demo", "--model", "/nonexistent/model"])
    assert "'/nonexistent/model' is not a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["no-such-command"])
