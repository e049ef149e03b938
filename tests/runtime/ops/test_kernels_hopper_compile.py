"""Every Triton kernel compiles for Hopper (``sm_90``) with the argument types that Inductor and
AOTInductor may pass: Python floats as fp32 or fp64, Python ints as int32 or int64, and bf16,
fp16 and fp32 tensors.

No GPU is needed: Triton's compiler and ``ptxas`` run on any machine. The launches are not
written out by hand: each launcher is called on small CPU tensors with ``wrap_triton``
replaced by a recorder, so the test compiles exactly the arguments and compile-time constants
the launchers pass, and a kernel that is added later is covered (or the coverage check fails).
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import os
import pkgutil
import subprocess
import sys

import pytest
import torch

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from kvpop_compile.runtime import kernels  # noqa: E402

# Every kernel file of the package, one per op (``common`` holds the shared helpers): a new
# op's file is checked without being listed here.
KERNEL_MODULES = [
    f"kvpop_compile.runtime.kernels.{module.name}"
    for module in pkgutil.iter_modules(kernels.__path__)
    if module.name != "common"
]
# Under TRITON_INTERPRET=1 (the test suite's setting) @triton.jit makes interpreted functions.
JIT_KINDS = (JITFunction, InterpretedFunction)
HOPPER = GPUTarget("cuda", 90, 64)
TENSOR_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
TRITON_POINTER = {
    torch.bfloat16: "*bf16",
    torch.float16: "*fp16",
    torch.float32: "*fp32",
    torch.int64: "*i64",
    torch.int32: "*i32",
    torch.int8: "*i8",
    torch.bool: "*i1",
}
# (float scalar, int scalar): what a plain launch passes, and the widest Inductor may pass.
SCALAR_WIDTHS = [("fp32", "i32"), ("fp64", "i64")]


def _has_nvidia_backend() -> bool:
    try:
        importlib.import_module("triton.backends.nvidia.compiler")
    except ImportError:
        return False
    return True


pytestmark = pytest.mark.skipif(
    not _has_nvidia_backend(), reason="this triton build has no NVIDIA backend to compile with"
)


class _Recorder:
    """Stands in for ``wrap_triton``: ``wrap(kernel)[grid](*args, **constexprs)`` records the
    launch instead of running it."""

    def __init__(self):
        self.launches: list[tuple[object, tuple, dict]] = []

    def __call__(self, kernel):
        def at_grid(grid):
            def launch(*args, **kwargs):
                self.launches.append((kernel, args, kwargs))

            return launch

        return _Indexable(at_grid)


class _Indexable:
    def __init__(self, at_grid):
        self.at_grid = at_grid

    def __getitem__(self, grid):
        return self.at_grid(grid)


def _all_launches(dtype: torch.dtype) -> list[tuple[object, tuple, dict]]:
    """The launches of every launcher, on CPU tensors of ``dtype`` (shapes of a small GQA model:
    2 KV heads, group 2, head_dim 64)."""
    recorder = _Recorder()
    patches = pytest.MonkeyPatch()
    for name in KERNEL_MODULES:
        patches.setattr(importlib.import_module(name), "wrap_triton", recorder)
    try:
        b, hkv, g, d, n = 1, 2, 2, 64, 40
        sinks, topk, window = 2, 6, 4
        cap = sinks + topk + window
        q = torch.randn(b, hkv * g, 1, d, dtype=dtype)
        keys = torch.randn(b, hkv, cap, d, dtype=dtype)
        positions = torch.arange(cap).expand(b, hkv, cap).contiguous()
        for with_probs, splits in ((True, 1), (False, 3)):
            kernels.decode_attention(q, keys, keys, positions, 0.125, with_probs, splits)
        priorities = torch.randn(b, hkv, topk)
        token = torch.randn(b, hkv, 1, d, dtype=dtype)
        window_keys = torch.zeros(b, hkv, window, d, dtype=dtype)
        for stat_slots, pool in itertools.product((cap, 0), (topk, 0)):
            statistic = torch.zeros(b, hkv, stat_slots)
            leaving = torch.zeros(b, hkv)
            kernels.update_cache(
                keys, keys.clone(), positions, priorities[..., :pool], window_keys, statistic,
                token[:, :, 0], token[:, :, 0], leaving.long(), leaving, leaving,
                torch.tensor([5]), token, token, token, sinks, pool, window,
            )  # fmt: skip
        memory_state = torch.zeros(b, hkv, 33, 32)
        shapes = [(d, 32), (d, 32), (2 * d, 32), (2 * d, 2), (2,), (2 * d + 32, 64), (64,),
                  (64, 1), (1,)]  # fmt: skip
        weights = [torch.randn(hkv, *shape) for shape in shapes]
        kernels.memory_scorer_step(memory_state, *(token[:, :, 0] for _ in range(4)), weights)
        priority = torch.randn(b, hkv, n)
        kernels.eviction_steps(priority, sinks, window, topk)
        kernels.running_topk_boundary(priority, sinks, window, topk)
        qn = torch.randn(b, hkv * g, n, d, dtype=dtype)
        kn = torch.randn(b, hkv, n, d, dtype=dtype)
        steps = torch.full((b, hkv, n), n)
        kernels.masked_attention(qn, kn, kn, steps, 0.125)
        kernels.masked_attention(qn, kn, kn, None, 0.125)
        # A prompt chunk continuing a cache: keys with positions, the cache's first.
        held = torch.cat([keys, kn], dim=2)
        key_positions = torch.arange(cap + n).expand(b, hkv, cap + n).contiguous()
        kernels.masked_attention(qn, held, held, torch.full_like(key_positions, n), 0.125,
                                 key_positions)  # fmt: skip
        for aggregate, power in (("mean", 1.0), ("max", 1.0), ("power_mean", 4.0)):
            kernels.future_attention_target(qn, kn, torch.zeros(b, hkv * g, n), window, 0.125,
                                            aggregate, power)  # fmt: skip
    finally:
        patches.undo()
    return recorder.launches


def _signature(kernel, args: tuple, kwargs: dict, float_type: str, int_type: str):
    """Triton's signature and constexprs for one recorded launch."""
    names = kernel.arg_names
    signature, constexprs = {}, {}
    for name, value in zip(names, args, strict=False):
        if isinstance(value, torch.Tensor):
            signature[name] = TRITON_POINTER[value.dtype]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            signature[name] = int_type
        elif isinstance(value, float):
            signature[name] = float_type
        else:
            raise TypeError(f"{kernel.__name__}: argument {name} of unexpected type {type(value)}")
    for name, value in kwargs.items():
        signature[name] = "constexpr"
        constexprs[name] = value
    missing = [name for name in names if name not in signature]
    if missing:
        raise TypeError(f"{kernel.__name__}: launch did not pass {missing}")
    return signature, constexprs


def _compile_cases():
    """``(label, kernel, signature, constexprs)`` of every distinct launch."""
    cases, seen = [], set()
    for dtype, (float_type, int_type) in itertools.product(TENSOR_DTYPES, SCALAR_WIDTHS):
        for kernel, args, kwargs in _all_launches(dtype):
            signature, constexprs = _signature(kernel, args, kwargs, float_type, int_type)
            key = (kernel.__name__, tuple(signature.items()), tuple(sorted(constexprs.items())))
            if key not in seen:
                seen.add(key)
                label = f"{kernel.__name__}[{TENSOR_DTYPES[dtype]}, {float_type}, {int_type}]"
                cases.append((f"{label} {constexprs}", kernel, signature, constexprs))
    return cases


def compile_all() -> list[str]:
    """Compile every recorded launch for Hopper; the failures, one line each. Runs where triton
    is not interpreting (the interpreter patches ``triton.language`` for its own use)."""
    cases = _compile_cases()
    failures = []
    for label, kernel, signature, constexprs in cases:
        source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
        try:
            compiled = triton.compile(source, target=HOPPER)
        except Exception as error:  # every compile error is a finding
            failures.append(f"{label}: {type(error).__name__}: " + str(error).replace("\n", " | "))
            continue
        if not compiled.asm.get("cubin"):
            failures.append(f"{label}: ptxas produced no cubin")
    print(f"compiled {len(cases)} launches for sm_90, {len(failures)} failed")
    return failures


def test_every_kernel_is_launched_by_a_launcher():
    """A kernel that no launcher here reaches would escape the compile check. Kernels are the
    jit functions named ``*_kernel``; the others are helpers a kernel calls, compiled with it."""
    defined = {
        obj.__name__
        for name in KERNEL_MODULES
        for _, obj in inspect.getmembers(importlib.import_module(name))
        if isinstance(obj, JIT_KINDS) and obj.fn.__module__ == name
        and obj.__name__.endswith("_kernel")
    }  # fmt: skip
    launched = {kernel.__name__ for kernel, _, _ in _all_launches(torch.float32)}
    assert defined == launched, f"kernels never launched here: {sorted(defined - launched)}"


def test_every_kernel_compiles_for_hopper():
    # A fresh interpreter without TRITON_INTERPRET: the suite's interpreter cannot compile.
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    result = subprocess.run(
        [sys.executable, __file__], env=env, capture_output=True, text=True, timeout=1200
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]


if __name__ == "__main__":
    problems = compile_all()
    print("\n".join(problems))
    sys.exit(1 if problems else 0)
