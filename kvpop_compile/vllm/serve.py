"""``kvpop-compile serve``: vLLM's OpenAI-compatible server on a local checkpoint, each request
with a bounded cache.

The command line it starts is vLLM's own server module (``python -m
vllm.entrypoints.openai.api_server``; vLLM's CPU build lacks a working ``vllm serve``), given
the KVpop architecture and budget as ``--hf-overrides`` and prefix caching off. A byte-level
checkpoint without tokenizer files (the embedded model) is served with the byte tokenizer of
:mod:`kvpop_compile.embedded.tokenizer`.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from ..embedded.tokenizer import write_byte_tokenizer
from .settings import ServeSettings, engine_kwargs

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
BYTE_VOCAB = 256


def checkpoint_architecture(model: str | os.PathLike) -> tuple[str, dict]:
    """The first architecture a checkpoint folder's ``config.json`` names, and the config."""
    path = Path(model) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{model} is not a Hugging Face checkpoint folder: no config.json")
    config = json.loads(path.read_text())
    architectures = config.get("architectures") or [None]
    return architectures[0], config


def tokenizer_for(model: str | os.PathLike, config: dict) -> str | None:
    """The tokenizer folder to serve ``model`` with: None where the checkpoint has its own, a
    byte tokenizer for a byte-vocabulary checkpoint without one, else ``ValueError``."""
    if any((Path(model) / name).is_file() for name in TOKENIZER_FILES):
        return None
    if config.get("vocab_size") == BYTE_VOCAB:
        return str(write_byte_tokenizer(Path(tempfile.gettempdir()) / "kvpop-byte-tokenizer"))
    raise ValueError(
        f"{model} has no tokenizer files ({', '.join(TOKENIZER_FILES)}) and is not a "
        f"{BYTE_VOCAB}-token byte model: add its tokenizer to the folder"
    )


def server_command(
    model: str | os.PathLike,
    settings: ServeSettings,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    extra: list[str] | None = None,
) -> list[str]:
    """The argv that starts vLLM's server on ``model`` with ``settings`` (``extra``: more
    vLLM options, passed through)."""
    architecture, config = checkpoint_architecture(model)
    kwargs = engine_kwargs(architecture, settings)
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--host", host, "--port", str(port),
        "--hf-overrides", json.dumps(kwargs["hf_overrides"]), "--no-enable-prefix-caching",
    ]  # fmt: skip
    tokenizer = tokenizer_for(model, config)
    if tokenizer is not None:
        argv += ["--tokenizer", tokenizer]
    return argv + list(extra or [])


def serve(model, settings: ServeSettings, **options) -> int:
    """Replace this process with vLLM's server (:func:`server_command`)."""
    argv = server_command(model, settings, **options)
    print(" ".join(argv), file=sys.stderr, flush=True)
    os.execv(argv[0], argv)
    return 0  # not reached: execv does not return


HEURISTICS = ("window", "knorm", "random", "h2o", "tova")
"""Policies served without a trained scorer."""
DEFAULT_CAPACITY = 512
DEFAULT_WINDOW = 256


def add_arguments(parser) -> None:
    """``kvpop-compile serve``'s options on an argparse parser."""
    parser.add_argument("model", help="local Hugging Face Qwen3 or Qwen3-MoE checkpoint folder")
    policy = parser.add_mutually_exclusive_group()
    policy.add_argument(
        "--scorer-path", metavar="DIR", help="trained scorer folder (save_scorer / train)"
    )
    policy.add_argument(
        "--policy", choices=HEURISTICS,
        help="a heuristic policy instead of a trained scorer (default: window)",
    )  # fmt: skip
    parser.add_argument(
        "--capacity", type=int,
        help=f"cache slots per layer and KV head (default: the scorer's, or {DEFAULT_CAPACITY})",
    )  # fmt: skip
    parser.add_argument(
        "--window", type=int,
        help="most recent tokens kept, inside the capacity (default: the scorer's)",
    )  # fmt: skip
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (8000)")
    # ``main`` hands what follows ``--`` on the command line to vLLM's server unchanged.
    parser.set_defaults(vllm_options=[])
    parser.epilog = "Options after -- go to vLLM's server unchanged (--dtype, --max-model-len, …)."


def settings_from_arguments(args) -> ServeSettings:
    """The served settings ``serve``'s arguments name (see :func:`add_arguments`)."""
    from ..config import KVpopConfig
    from .settings import serve_settings

    for name in ("capacity", "window"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name} must be >= 1, got {value}")
    window = args.window
    if args.scorer_path is not None:
        return serve_settings(args.scorer_path, capacity=args.capacity, window=window)
    if window is not None:
        raise ValueError(
            "--window sets a trained scorer's window (--scorer-path); a heuristic policy keeps "
            "its own"
        )
    capacity = DEFAULT_CAPACITY if args.capacity is None else args.capacity
    window = min(DEFAULT_WINDOW, capacity // 2)
    config = KVpopConfig(sinks=4, window=max(window, 1), topk=0, scorer=args.policy or "window")
    return serve_settings(config=config, capacity=capacity)


def serve_command(args) -> int:
    """Run ``kvpop-compile serve``: this process becomes vLLM's server."""
    settings = settings_from_arguments(args)
    return serve(args.model, settings, host=args.host, port=args.port, extra=args.vllm_options)
