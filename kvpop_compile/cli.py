"""The ``kvpop-compile`` command line."""

from __future__ import annotations

import argparse
import sys


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    result = run_demo(
        tokens=args.tokens, capacity=args.capacity, scorer=args.scorer, seed=args.seed
    )
    for line in result.report():
        print(line)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvpop-compile", description="Bounded KV cache with a learned policy for Qwen3."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="show the bounded cache on a small Qwen3")
    demo.add_argument("--tokens", type=int, default=1024, help="tokens to decode (default 1024)")
    demo.add_argument("--capacity", type=int, default=128, help="cache slots (default 128)")
    demo.add_argument("--scorer", default="window", help="policy (default window)")
    demo.add_argument("--seed", type=int, default=0, help="model initialisation seed")
    demo.set_defaults(run=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except ValueError as error:
        print(f"kvpop-compile {args.command}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
