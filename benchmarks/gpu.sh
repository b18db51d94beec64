#!/usr/bin/env bash
# namc_base on a CUDA GPU: the CUDA tests, then the `namc benchmark` runs behind docs/performance.md's GPU tables.
#
#   bash benchmarks/gpu.sh OUT_DIR
#
# Needs a CUDA GPU, this repository (for its tests) and namc installed with its test tools (pip install -e ".[dev]").
# Writes into OUT_DIR, one JSON report per `namc benchmark` process (schema: docs/benchmark_schema.md), so one that
# fails leaves the others:
#   tests.log                          tests/test_static_decode.py (CUDA graphs against eager decoding)
#   runN_small.json, runN_large.json   namc_base against the CLIP4IDC peer, batch 1 8 64 and 256 1024, decode and
#                                      end to end, for N = 1 .. RUNS
#   runN_train.json                    pre-training steps at the paper's 64 pairs per GPU
#   eager.json, static.json            decoding with FDG.generate's eager loop against StaticDecoder's CUDA graphs
#   train128.json                      pre-training steps at 128 pairs per GPU
#   benchmark.log                      what every process printed
# Store OUT_DIR as benchmarks/results/<gpu>-namc_base-vs-clip4idc and run `python benchmarks/tables.py` to render it.
#
# Settings from the environment: RUNS (2), MODEL (namc_base), DTYPE (bfloat16), GEMM_SIZE (8192, the side of the
# GEMM the efficiency figures divide by), the batch sizes SMALL ("1 8 64"), LARGE ("256 1024") and GRAPHS
# ("1 64 1024", eager against CUDA graphs). A dry run of the whole script without a GPU:
# DEVICE=cpu DTYPE=float32 MODEL=namc_tiny GEMM_SIZE=256 RUNS=1 SMALL=1 LARGE=2 GRAPHS=1 bash benchmarks/gpu.sh OUT
# shellcheck disable=SC2086  # the batch-size lists split into words on purpose
set -euo pipefail
usage="usage: bash benchmarks/gpu.sh OUT_DIR (a CUDA GPU, this repository and namc[dev] installed)"
[[ $# -eq 1 && $1 != -* ]] || { echo "$usage" >&2; exit 2; }
DEVICE=${DEVICE:-cuda}
if [[ $DEVICE == cuda* ]] && ! nvidia-smi --query-gpu=name --format=csv,noheader >/dev/null 2>&1; then
    echo "gpu.sh: no CUDA GPU here (nvidia-smi finds none); DEVICE=cpu DTYPE=float32 MODEL=namc_tiny is a dry run" >&2
    exit 2
fi
command -v namc >/dev/null || { echo "gpu.sh: namc is not installed: pip install -e \".[dev]\"" >&2; exit 2; }
RUNS=${RUNS:-2}
MODEL=${MODEL:-namc_base}
DTYPE=${DTYPE:-bfloat16}
GEMM_SIZE=${GEMM_SIZE:-8192}
SMALL=${SMALL:-1 8 64}
LARGE=${LARGE:-256 1024}
GRAPHS=${GRAPHS:-1 64 1024}
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."
failed=()

bench() { # NAME ARGS...: one `namc benchmark` process writing OUT/NAME.json
    local name=$1
    shift
    echo "== $name: $*" | tee -a "$OUT/benchmark.log"
    namc benchmark --model "$MODEL" --device "$DEVICE" --dtype "$DTYPE" --gemm-size "$GEMM_SIZE" \
        --output "$OUT/$name.json" "$@" >>"$OUT/benchmark.log" 2>&1 || failed+=("$name")
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true; } | tee "$OUT/tests.log"
python -m pytest -q -m "" -p no:cacheprovider tests/test_static_decode.py 2>&1 | tee -a "$OUT/tests.log" ||
    failed+=(tests)
for ((run = 1; run <= RUNS; run++)); do
    bench "run${run}_small" --static-decode --reference clip4idc --batch-sizes $SMALL --modes decode e2e
    bench "run${run}_train" --reference none --batch-sizes 1 --modes decode --train-batch-size 64 --train-steps 5 \
        --train-warmup 2
    bench "run${run}_large" --static-decode --reference clip4idc --batch-sizes $LARGE --modes decode e2e
done
bench eager --reference none --batch-sizes $GRAPHS --modes decode e2e
bench static --static-decode --reference none --batch-sizes $GRAPHS --modes decode e2e
bench train128 --reference none --batch-sizes 1 --modes decode --train-batch-size 128 --train-steps 5 \
    --train-warmup 2
if ((${#failed[@]})); then
    echo "gpu.sh: failed: ${failed[*]} (see $OUT/tests.log and $OUT/benchmark.log)" >&2
    exit 1
fi
echo "gpu.sh: reports in $OUT"
