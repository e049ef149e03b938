"""``kvpop-compile serve``'s command line: vLLM's server module with the KVpop architecture
and budget as hf_overrides, prefix caching off, 127.0.0.1 by default, the byte tokenizer for a
byte model without tokenizer files, and clear errors for what cannot be served."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import pytest
from script_support import copy_of_shipped_scorer

from kvpop_compile.config import KVpopConfig
from kvpop_compile.embedded import EMBEDDED_MODEL
from kvpop_compile.scorer_io import saved_config
from kvpop_compile.vllm import ServeSettings, engine_kwargs, serve_settings
from kvpop_compile.vllm.serve import add_arguments, server_command, settings_from_arguments

SHIPPED = EMBEDDED_MODEL.parent / "scorers" / "mlp-512"  # saved with a per-layer budget


@pytest.fixture(scope="module")
def scorer(tmp_path_factory):
    """The shipped mlp-512 scorer at its one budget (vLLM serves one budget in every layer)."""
    return copy_of_shipped_scorer(tmp_path_factory.mktemp("scorer"), "mlp", 512)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_command_starts_vllms_server_with_the_kvpop_architecture_and_budget(scorer):
    settings = settings_from_arguments(_args(str(EMBEDDED_MODEL), "--scorer-path", str(scorer)))
    argv = server_command(EMBEDDED_MODEL, settings, extra=["--dtype", "float32"])
    assert argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert _option(argv, "--host") == "127.0.0.1" and _option(argv, "--port") == "8000"
    assert "--no-enable-prefix-caching" in argv and argv[-2:] == ["--dtype", "float32"]
    overrides = json.loads(_option(argv, "--hf-overrides"))
    assert overrides["architectures"] == ["KVpopQwen3ForCausalLM"]
    served = ServeSettings(KVpopConfig(**overrides["kvpop"]["config"]),
                           overrides["kvpop"]["scorer_path"])  # fmt: skip
    assert served == settings
    assert served.config == saved_config(scorer) and served.scorer_path == str(scorer.resolve())
    # The embedded model has no tokenizer files: it is served with the byte tokenizer.
    tokenizer = _option(argv, "--tokenizer")
    vocab = json.loads((Path(tokenizer) / "tokenizer.json").read_text())
    assert sorted(vocab["model"]["vocab"].values()) == list(range(256))


def test_capacity_resizes_the_pool_and_keeps_the_trained_window(scorer):
    trained = saved_config(scorer)
    floor = trained.sinks + trained.window  # the least capacity that keeps the window
    for capacity in (floor + 1, floor + 50, trained.capacity + 100):
        settings = settings_from_arguments(
            _args(str(EMBEDDED_MODEL), "--scorer-path", str(scorer), "--capacity", str(capacity))
        )
        assert settings.config.capacity == capacity and settings.config.window == trained.window
        assert settings.config.topk == capacity - floor
    with pytest.raises(ValueError, match=f"capacity {floor - 1} is below sinks \\+ window = "
                                         f"{floor}"):  # fmt: skip
        settings_from_arguments(_args(str(EMBEDDED_MODEL), "--scorer-path", str(scorer),
                                      "--capacity", str(floor - 1)))  # fmt: skip


@pytest.mark.parametrize(("argv", "scorer", "capacity"), [
    ((), "window", 512), (("--policy", "tova"), "tova", 512),
    (("--policy", "knorm", "--capacity", "100"), "knorm", 100),
])  # fmt: skip
def test_heuristic_policies_need_no_scorer(argv, scorer, capacity):
    settings = settings_from_arguments(_args(str(EMBEDDED_MODEL), *argv))
    assert settings.config.scorer.value == scorer and settings.config.capacity == capacity
    assert settings.scorer_path is None


def test_a_scorer_and_a_policy_together_are_refused(capsys, scorer):
    with pytest.raises(SystemExit):
        _args(str(EMBEDDED_MODEL), "--scorer-path", str(scorer), "--policy", "window")
    assert "not allowed with argument" in capsys.readouterr().err


def test_what_cannot_be_served_is_refused(tmp_path):
    settings = serve_settings(config=KVpopConfig(sinks=4, window=16, topk=44))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        server_command(tmp_path, settings)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ValueError, match="serves Qwen3ForCausalLM, Qwen3MoeForCausalLM .*"
                                         "got 'LlamaForCausalLM'"):  # fmt: skip
        server_command(tmp_path, settings)
    config = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="has no tokenizer files .* not a 256-token byte model"):
        server_command(tmp_path, settings)
    (tmp_path / "tokenizer.json").write_text("{}")  # its own tokenizer: no --tokenizer given
    assert "--tokenizer" not in server_command(tmp_path, settings)


def test_engine_kwargs_for_qwen3_moe_and_prefix_caching_off():
    kwargs = engine_kwargs("Qwen3MoeForCausalLM", serve_settings(config=KVpopConfig()))
    assert kwargs["hf_overrides"]["architectures"] == ["KVpopQwen3MoeForCausalLM"]
    assert kwargs["enable_prefix_caching"] is False


def test_kvpop_compile_serve_execs_the_server_with_options_after_the_double_dash(monkeypatch):
    from kvpop_compile.cli.parser import main
    from kvpop_compile.vllm import serve as serve_module

    started = []
    monkeypatch.setattr(serve_module.os, "execv", lambda path, argv: started.append(argv))
    argv = ["serve", str(EMBEDDED_MODEL), "--policy", "tova", "--capacity", "128",
            "--port", "9123", "--", "--dtype", "float32", "--max-model-len", "2048"]  # fmt: skip
    assert main(argv) == 0
    (argv,) = started
    assert argv[-4:] == ["--dtype", "float32", "--max-model-len", "2048"]
    assert _option(argv, "--port") == "9123" and _option(argv, "--host") == "127.0.0.1"
    config = json.loads(_option(argv, "--hf-overrides"))["kvpop"]["config"]
    assert config["scorer"] == "tova" and KVpopConfig(**config).capacity == 128


def test_options_after_the_double_dash_belong_to_serve_only(capsys):
    from kvpop_compile.cli.parser import main

    with pytest.raises(SystemExit):
        main(["demo", "--", "--dtype", "float32"])
    assert "only serve takes them, not demo" in capsys.readouterr().err


PER_LAYER = KVpopConfig(sinks=4, window=(44, 44, 44, 192), topk=(16, 16, 16, 636))


def test_a_per_layer_budget_is_served_only_at_one_budget(tmp_path):
    with pytest.raises(ValueError, match=r"vLLM serves one budget in every layer; this config "
                                         r"keeps \[64, 64, 64, 832\] slots .*capacity=N, "
                                         r"window=W"):  # fmt: skip
        serve_settings(config=PER_LAYER)
    with pytest.raises(ValueError, match=r"per-layer budget \(\[64, 64, 64, 832\] slots per KV "
                                         r"head\); give both capacity and window"):  # fmt: skip
        serve_settings(config=PER_LAYER, capacity=256)
    with pytest.raises(ValueError, match="give both capacity and window"):
        serve_settings(config=PER_LAYER, window=96)
    one = serve_settings(config=PER_LAYER, capacity=256, window=96).config
    assert (one.sinks, one.window, one.topk, one.per_layer) == (4, 96, 156, None)
    # The model's hf_overrides entry is checked the same way when vLLM builds the model.
    entry = type("HFConfig", (), {"kvpop": {"config": PER_LAYER.to_dict(), "scorer_path": None}})
    with pytest.raises(ValueError, match="vLLM serves one budget in every layer"):
        ServeSettings.from_hf_config(entry)


def test_window_sets_a_trained_scorers_window_and_nothing_else(scorer):
    trained = saved_config(scorer)
    args = ("--scorer-path", str(scorer), "--capacity", "300", "--window", "100")
    settings = settings_from_arguments(_args(str(EMBEDDED_MODEL), *args))
    assert (settings.config.window, settings.config.topk) == (100, 300 - trained.sinks - 100)
    assert settings.config.scorer == trained.scorer and settings.config.lam == trained.lam
    with pytest.raises(ValueError, match="--window sets a trained scorer's window"):
        settings_from_arguments(_args(str(EMBEDDED_MODEL), "--policy", "tova", "--window", "8"))
    with pytest.raises(ValueError, match="--window must be >= 1, got 0"):
        settings_from_arguments(_args(str(EMBEDDED_MODEL), "--scorer-path", str(scorer),
                                      "--window", "0"))  # fmt: skip


def test_the_shipped_per_layer_scorer_is_served_at_the_budget_given(scorer):
    with pytest.raises(ValueError, match="vLLM serves one budget in every layer"):
        settings_from_arguments(_args(str(EMBEDDED_MODEL), "--scorer-path", str(SHIPPED)))
    with pytest.raises(ValueError, match="give both capacity and window"):
        settings_from_arguments(_args(str(EMBEDDED_MODEL), "--scorer-path", str(SHIPPED),
                                      "--capacity", "512"))  # fmt: skip
    args = ("--scorer-path", str(SHIPPED), "--capacity", "512", "--window", "384")
    config = settings_from_arguments(_args(str(EMBEDDED_MODEL), *args)).config
    assert config == dataclasses.replace(saved_config(SHIPPED), window=384, topk=512 - 4 - 384)
    # the one budget the plugin's engine tests serve (the same tensors, test_vllm_plugin.py),
    # at the recency term the folder keeps now, not the one it had at one budget
    one_budget = saved_config(scorer)
    assert (one_budget.lam, config.lam) == (0.0005, 0.0)
    assert config == dataclasses.replace(one_budget, lam=0.0)
