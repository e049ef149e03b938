#!/usr/bin/env bash
# GPU checks, on a machine with a CUDA GPU and PyTorch installed (no network needed), in well
# under 8 minutes: every Triton kernel's property tests on CUDA (compiled, not interpreted), the
# end-to-end and compiled decode on the kernels, the engine tests (AOTInductor; TensorRT when
# torch-tensorrt is importable), then the kernel benchmark, which writes
# benchmarks/results/kernels_gpu.md (copied to $OUT when that is set).
# Uses the machine's Python with this checkout on PYTHONPATH. Exits non-zero if a test fails;
# skipped tests print their reason.
set -euo pipefail
cd "$(dirname "$0")/.."
# Compiled kernels: the interpreter would run CUDA tensors through numpy.
export TRITON_INTERPRET=0
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,memory.total --format=csv
python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)"
status=0
python3 -m pytest -q -rs -p no:cacheprovider \
    tests/test_kernels_cache.py tests/test_kernels_topk.py tests/test_kernels_attention.py \
    tests/test_kernels_end_to_end.py tests/test_compile_decode.py tests/test_gpu_engines.py \
    || status=$?
python3 benchmarks/kernels.py || status=$?
if [[ -n "${OUT:-}" ]]; then cp benchmarks/results/kernels_gpu.md "$OUT"/ || true; fi
exit "$status"
