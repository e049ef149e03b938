"""A transformed model generates the same tokens whether its ``kvpop`` ops run the Triton
kernels or the PyTorch references (design.md §6, on the kernel path)."""

import pytest
import torch
from kernel_support import kernel_devices, kernels_enabled
from tiny_models import prompt, tiny_qwen3

import kvpop_compile as kc
from kvpop_compile.runtime.dispatch import triton_kernels_on_cpu


@pytest.mark.parametrize("device", kernel_devices())
@pytest.mark.parametrize("scorer", ["memory", "h2o"])
def test_kernels_generate_the_reference_tokens(device, scorer):
    config = kc.KVpopConfig(sinks=2, window=4, topk=6, scorer=scorer)  # capacity 12 << 40
    model = kc.transform(tiny_qwen3(), config)
    ids = prompt(length=16)
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=24, do_sample=False)  # CPU references
        model.to(device)
        with kernels_enabled(device):
            got = model.generate(ids.to(device), max_new_tokens=24, do_sample=False)
    assert torch.equal(got.cpu(), expected)


def test_kernels_on_cpu_need_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"), triton_kernels_on_cpu():
        pass
