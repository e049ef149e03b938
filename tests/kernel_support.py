"""Where the Triton kernel tests run, and the float64 truths their tolerances come from.

Kernels run on CPU tensors through Triton's interpreter (``TRITON_INTERPRET=1``, the test
default) and on CUDA when a GPU is present and the interpreter is off (``scripts/gpu_check.sh``).
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from kvpop_compile.runtime.dispatch import interpreting, triton_kernels_on_cpu


def kernel_devices() -> list:
    devices = []
    if interpreting():
        devices.append("cpu")
    elif torch.cuda.is_available():
        devices.append("cuda")
    if not devices:
        return [
            pytest.param(
                "none",
                marks=pytest.mark.skip(
                    reason="Triton kernels need a CUDA GPU, or TRITON_INTERPRET=1 for CPU tensors"
                ),
            )
        ]
    return devices  # fmt: skip


def kernel_dtypes(device: str) -> list[torch.dtype]:
    """float32 everywhere; half precisions on the GPU (the interpreter computes in numpy)."""
    return [torch.float32] + ([torch.bfloat16, torch.float16] if device == "cuda" else [])


def kernels_enabled(device: str):
    """A context in which the ``kvpop`` ops on ``device`` run their Triton kernels."""
    return triton_kernels_on_cpu() if device == "cpu" else contextlib.nullcontext()


# A float32 reference output accumulates at most a few hundred roundings (the tests' sums run
# over at most ~150 keys and a 128-wide dot product), each at most one float32 ulp of the
# output's scale; measured errors stay below 4 such ulps. A reference further from the truth
# than this computes something else, and must fail rather than loosen the kernel's tolerance.
REFERENCE_ROUNDINGS = 256


def assert_as_accurate_as_reference(kernel, reference, truth, *, dtype, name="output"):
    """The kernel's error against a float64 truth is within a small multiple of the float32
    reference's own error, plus two roundings of the output's dtype (the kernel's and the
    reference's, which returns the input dtype): the tolerance comes from the reference's
    rounding at that precision, not from a constant. The reference's own error
    is bounded too (:data:`REFERENCE_ROUNDINGS` float32 ulps of the output's scale), so a wrong
    reference fails instead of widening the kernel's tolerance.

    ``dtype`` is the precision the output is rounded to. Compared in float64; infinite entries
    must match exactly.
    """
    kernel, reference, truth = (x.double() for x in (kernel, reference, truth))
    infinite = torch.isinf(truth)
    assert torch.equal(torch.isinf(kernel), infinite), f"{name}: infinities differ"
    assert torch.equal(torch.isinf(reference), infinite), f"{name}: reference infinities differ"
    finite = ~infinite
    if not finite.any():
        return
    scale = truth[finite].abs().max().clamp(min=1.0)
    reference_error = (reference - truth)[finite].abs().max()
    kernel_error = (kernel - truth)[finite].abs().max()
    # Plus the one rounding of a half-precision output (the reference returns the input dtype).
    reference_bound = (
        REFERENCE_ROUNDINGS * torch.finfo(torch.float32).eps + torch.finfo(dtype).eps
    ) * scale
    assert reference_error <= reference_bound, (
        f"{name}: the float32 reference is {reference_error:.3e} from the float64 truth, more "
        f"than rounding explains ({reference_bound:.3e}): it computes something else"
    )
    unit = torch.finfo(dtype).eps * scale
    bound = 4 * reference_error + 2 * unit
    assert kernel_error <= bound, (
        f"{name}: kernel error {kernel_error:.3e} > {bound:.3e} "
        f"(reference error {reference_error:.3e})"
    )


def attention_truth(q, k, v, visible, scale):
    """Dense float64 attention. q ``(B, Hkv, G, M, D)``, k/v ``(B, Hkv, T, D)``, visible
    broadcastable to ``(B, Hkv, G, M, T)``: ``out (B, Hkv, G, M, D)``, ``lse``, ``probs``."""
    scores = torch.einsum("bhgmd,bhtd->bhgmt", q.double(), k.double()) * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = (scores - lse.unsqueeze(-1)).exp()
    return torch.einsum("bhgmt,bhtd->bhgmd", probs, v.double()), lse, probs
