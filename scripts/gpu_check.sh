#!/usr/bin/env bash
# The GPU check: one command on a lent CUDA GPU (no network), most valuable figures first, each
# step's results written to $OUT (else benchmarks/results/) the moment it ends, so a cut-off run
# still leaves what it finished. The whole stays inside its own deadline (--budget, 470 s by
# default on the GPU, under an 8-minute call with the transfers around it; 1200 s for the CPU
# dry run):
#   1. correctness on CUDA: every Triton kernel's property tests (compiled, not interpreted),
#      compiled decode == eager, CUDA-graph replay == eager, the engine tests (AOTInductor;
#      TensorRT when torch-tensorrt is importable), chunked prefill on the kernels;
#   2. the 36-layer Qwen3-4B shape at 131k tokens: kc.compile and its CUDA-graph replay against
#      transformers' static cache + torch.compile (gpu_131072.md / .json);
#   3. the same at 8k, with the dynamic cache and eager KVpop too (gpu_8192.md / .json);
#   4. the kernel benchmark (kernels_gpu.md).
# steps.tsv records each step's exit status and seconds as it ends (124: its time ran out).
#
#   scripts/gpu_check.sh               # on the GPU machine: PYTHONPATH is set to this checkout
#   scripts/gpu_check.sh --dry-run     # any CPU: every step at tiny sizes (CI runs this)
#
# Uses the machine's Python and its transformers (any release kvpop_compile accepts; it
# refuses others at import); pytest-xdist spreads the tests over 8 workers when installed.
# Exits non-zero if a step fails or runs out of time.
set -uo pipefail
cd "$(dirname "$0")/.."

dry_run=0
budget=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --dry-run) dry_run=1 ;;
        --budget)
            if [[ $# -lt 2 || -z "$2" ]]; then
                echo "gpu_check.sh: --budget must be a whole number of seconds >= 30, got ''" >&2
                exit 2
            fi
            budget="$2"
            shift
            ;;
        *)
            echo "gpu_check.sh: unknown argument '$1' (allowed: --dry-run, --budget SECONDS)" >&2
            exit 2
            ;;
    esac
    shift
done
# A CPU runs the dry run's compiles far slower than the GPU machine runs the real steps.
((dry_run)) && budget="${budget:-1200}"
budget="${budget:-470}"
if ! [[ "$budget" =~ ^[0-9]+$ ]] || ((budget < 30)); then
    echo "gpu_check.sh: --budget must be a whole number of seconds >= 30, got '$budget'" >&2
    exit 2
fi
deadline=$((SECONDS + budget))

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if ((dry_run)); then
    # Triton's interpreter runs the kernels on CPU tensors; the steps run at tiny sizes.
    export TRITON_INTERPRET=1
    results="${OUT:-$(mktemp -d)}"
else
    # Compiled kernels: the interpreter would run CUDA tensors through numpy.
    export TRITON_INTERPRET=0
    results="${OUT:-benchmarks/results}"
fi
mkdir -p "$results"
steps="$results/steps.tsv"
printf 'step\tstatus\tseconds\n' >"$steps"
status=0

# step NAME SECONDS COMMAND...: run COMMAND under the smaller of SECONDS and the time left
# before the deadline; record its status and time in steps.tsv as soon as it ends.
step() {
    local name="$1" allowed="$2" left=$((deadline - SECONDS)) started=$SECONDS code=0
    shift 2
    ((allowed > left)) && allowed=$left
    if ((allowed < 10)); then
        printf '%s\tskipped: out of time\t0\n' "$name" >>"$steps"
        status=124
        return
    fi
    echo "== $name (at most ${allowed} s)"
    timeout --kill-after=10 "$allowed" "$@" || code=$?
    printf '%s\t%s\t%s\n' "$name" "$code" "$((SECONDS - started))" >>"$steps"
    ((code != 0)) && status=$code
}

{
    nvidia-smi --query-gpu=name,memory.total --format=csv 2>/dev/null || echo "no nvidia-smi"
    python3 -c "import torch, transformers, triton; print('torch', torch.__version__, \
'transformers', transformers.__version__, 'triton', triton.__version__)"
} | tee "$results/machine.txt"

correctness=(
    tests/runtime/ops/test_update_cache.py tests/runtime/ops/test_eviction_steps.py
    tests/runtime/ops/test_running_topk_boundary.py tests/runtime/ops/test_decode_attention.py
    tests/runtime/ops/test_masked_attention.py tests/runtime/ops/test_future_attention_target.py
    tests/runtime/ops/test_memory_scorer_step.py tests/runtime/ops/test_ops.py
    tests/invariants/test_kernels_end_to_end.py
    tests/runtime/test_compile_decode.py tests/test_cuda_graph.py tests/scripts/test_gpu_engines.py
    tests/runtime/test_chunk_step.py::test_chunked_prefill_on_the_triton_kernels_matches_the_reference
)
if ((dry_run)); then
    # The CPU suite runs these tests already; here it only checks that each one named exists.
    step correctness 300 python3 -m pytest -q --collect-only -p no:cacheprovider \
        "${correctness[@]}"
    long=(--device cpu --shape tiny --steps 2 --warmup 1)
    step long_context_131072 400 python3 -m benchmarks.gpu_long_context "${long[@]}" \
        --lengths 96 --methods static compile graph --out "$results/gpu_131072.md"
    step long_context_8192 300 python3 -m benchmarks.gpu_long_context "${long[@]}" \
        --lengths 48 --out "$results/gpu_8192.md"
    step kernels 200 python3 -m benchmarks.triton_kernels --quick --out "$results/kernels_gpu.md"
else
    workers=()
    if python3 -c "import xdist" 2>/dev/null; then workers=(-n 8); fi
    step correctness 150 python3 -m pytest -q -rs -p no:cacheprovider "${workers[@]}" \
        --junitxml="$results/correctness.xml" "${correctness[@]}"
    step long_context_131072 150 python3 -m benchmarks.gpu_long_context --lengths 131072 \
        --methods static compile graph --out "$results/gpu_131072.md"
    step long_context_8192 100 python3 -m benchmarks.gpu_long_context --lengths 8192 \
        --out "$results/gpu_8192.md"
    step kernels 60 python3 -m benchmarks.triton_kernels --out "$results/kernels_gpu.md"
fi
echo "== steps (results in $results)"
cat "$steps"
exit "$status"
