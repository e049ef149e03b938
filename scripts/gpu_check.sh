#!/usr/bin/env bash
# GPU checks, on a machine with a CUDA GPU and PyTorch installed (no network needed): the
# engine tests on the GPU (AOTInductor; TensorRT when torch-tensorrt is importable) and the
# compiled TensorRT decode step. Uses the machine's Python with this checkout on PYTHONPATH.
# Exits non-zero if a test fails; skipped tests print their reason.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,memory.total --format=csv
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
python3 -m pytest -q -rs -p no:cacheprovider tests/test_gpu_engines.py
