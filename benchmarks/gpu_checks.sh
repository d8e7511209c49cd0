#!/bin/bash
# The checks that need a GPU, in the order they matter, each bounded so one short run gives answers:
#   bash benchmarks/gpu_checks.sh [LOG_DIR]        (default: gpu-logs; needs CUDA, attnx[dev,fla])
# 1. the linear / cosFormer Triton kernels compiled (their loop rewrite has not run on a GPU yet),
# 2. every Triton kernel's tests compiled, the slow ones included,
# 3. the fla adapter's layers vs the library's CUDA kernels (the reasons of the 4 failures left open),
# 4. the gated op's kernels timed (kda and delta were not reached last time), 5. the fla layers timed.
# docs/tensorrt.md ("The Triton kernels on an H200") and docs/benchmarks.md say what the last run gave.
set -u
logs=$(realpath -m "${1:-gpu-logs}")
mkdir -p "$logs"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$logs/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$logs/env.txt"
pytest_gpu() {  # name, timeout, pytest arguments...
    local name=$1 limit=$2
    shift 2
    timeout "$limit" python3 -m pytest -p no:randomly -p no:cacheprovider -m "slow or not slow" -n 8 -v \
        --timeout 120 --tb=short "$@" > "$logs/$name.log" 2>&1
    echo "$name: exit $? ($(grep -cE '(PASSED|FAILED)' "$logs/$name.log") results, see $logs/$name.log)"
}
pytest_gpu linear-kernels 120 tests/kernels -k "linear or cosformer"
pytest_gpu kernels 240 tests/kernels
pytest_gpu fla-layers 300 --maxfail 8 tests/adapters/fla/test_gpu.py -k "130 or chunked"
cd benchmarks || exit 1
timeout 150 python3 gated.py --device cuda --candidates torch,triton,fla --rules kda,delta,gated_delta \
    --seq-lens 4096,16384 --rounds 5 --json "$logs/gated_cuda.json" > "$logs/gated.log" 2>&1
grep "N=" "$logs/gated.log"
timeout 200 python3 fla_gpu.py --lengths 4096 --json "$logs/fla_gpu.json" > "$logs/fla.log" 2>&1
grep '"layer"' "$logs/fla.log" | cut -c1-200
