#!/usr/bin/env bash
# GPU checks, on a machine with a CUDA GPU and PyTorch installed (no network needed), in under
# 8 minutes on an H200: every Triton kernel's property tests on CUDA (compiled, not
# interpreted), chunked prefill on the kernels, the end-to-end and compiled decode, the engine
# tests (AOTInductor; TensorRT when torch-tensorrt is importable); then the kernel benchmark
# (benchmarks/results/kernels_gpu.md) and the long-context benchmark on the 36-layer Qwen3-4B
# shape (benchmarks/results/gpu.md, every figure in gpu.json; the code of kvpop-compile bench).
# Results are copied to $OUT when it is set.
# Uses the machine's Python with this checkout on PYTHONPATH; pytest-xdist spreads the tests
# over 8 workers when it is installed. Exits non-zero if a step fails; skipped tests print
# their reason.
set -uo pipefail
cd "$(dirname "$0")/.."
# Compiled kernels: the interpreter would run CUDA tensors through numpy.
export TRITON_INTERPRET=0
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,memory.total --format=csv
python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)"
workers=()
if python3 -c "import xdist" 2>/dev/null; then workers=(-n 8); fi
status=0
timeout 200 python3 -m pytest -q -rs -p no:cacheprovider "${workers[@]}" \
    tests/test_kernels_cache.py tests/test_kernels_topk.py tests/test_kernels_attention.py \
    tests/test_kernels_memory_scorer.py tests/test_kernels_end_to_end.py \
    tests/test_compile_decode.py tests/test_gpu_engines.py \
    tests/test_cuda_graph.py \
    tests/test_chunked_prefill.py::test_chunked_prefill_on_the_triton_kernels_matches_the_reference \
    || status=$?
timeout 90 python3 benchmarks/kernels.py || status=$?
# 8k and 131k only: the targets are there, and a third length would not fit the 8 minutes.
timeout 330 python3 benchmarks/gpu_long_context.py --lengths 8192 131072 || status=$?
if [[ -n "${OUT:-}" ]]; then
    cp benchmarks/results/kernels_gpu.md benchmarks/results/gpu.md benchmarks/results/gpu.json \
        "$OUT"/ 2>/dev/null || true
fi
exit "$status"
