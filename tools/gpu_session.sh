#!/usr/bin/env bash
# The GPU part of the speed issue on a lent GPU machine, which has PyTorch but cannot reach a package index.
#
#   bash tools/gpu_session.sh wheels   # here, with pip and the index: the packages namc needs that the machine lacks
#   bash tools/gpu_session.sh check    # there, carrying .whl: the CUDA-graph tests and a short namc_tiny benchmark
#   bash tools/gpu_session.sh bench    # there: namc_base in bf16 against the CLIP4IDC peer, batch 1-1024, training
#   bash tools/gpu_session.sh lease    # there, in one call of under 10 minutes: the CUDA test, then `bench` in three
#                                      # processes (batch 1-64, training, batch 256-1024), each with its own time
#                                      # limit and JSON, so that one that fails or runs out leaves the others' figures;
#                                      # where CUDA graphs fail outright, a part reruns with eager decoding
#   bash tools/gpu_session.sh smoke    # there: Lightning on the GPU (the fast demo's pre-training and fine-tuning in
#                                      # bf16-mixed), and `namc describe` on CPU fp32, CUDA fp32 and CUDA bf16 over
#                                      # CAPTION_PAIRS with CAPTION_MODEL where both are given (carry them;
#                                      # DEMO_COPY: the fast demo's folder, made here, where Java is missing there)
#
# The machine's image has torch, torchvision, numpy, pillow, einops, huggingface_hub, safetensors, tqdm, regex, pyyaml
# and pytest, not open_clip, taming-transformers or ftfy, and its torch (2.11) is older than setup.cfg's
# torch>=2.14 (which is there to make pip take the index's CUDA build): so namc is put on PYTHONPATH, not installed,
# with the wheels from `wheels` beside it. The whole test suite passes on torch 2.11.0 (CPU).
#
# Settings from the environment: OUT (where figures and logs go: the device's folder that comes back; else
# ./gpu_out), DEVICE (cuda), DTYPE (bfloat16), WHEEL_DIR (.whl); for bench, BATCH_SIZES ("1 8 64 256 1024"),
# TRAIN_BATCH_SIZE (64; 0 skips training), NAME (gpu: NAME.json and NAME.log), SHORTLIST (0: the whole
# vocabulary; N: namc and the peer decode over N tokens, `--shortlist`), MODEL (namc_base) and BENCH_SECONDS (570,
# under the device's 10 minutes a command; split the batch sizes over two calls if it runs out); for lease,
# LEASE_SECONDS (560, all of it), SMALL_SECONDS (150), TRAIN_SECONDS (100), LARGE_SECONDS (170) and GEMM_SIZE
# (8192, the GEMM reference's side). A dry run on a CPU with torch installed, after `wheels`:
# DEVICE=cpu DTYPE=float32 bash tools/gpu_session.sh check (or MODEL=namc_tiny GEMM_SIZE=1024 ... lease)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bfloat16}
WHEEL_DIR=${WHEEL_DIR:-.whl}
BATCH_SIZES=${BATCH_SIZES:-1 8 64 256 1024}
TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-64}
NAME=${NAME:-gpu}
SHORTLIST=${SHORTLIST:-0}
BENCH_SECONDS=${BENCH_SECONDS:-570}
MODEL=${MODEL:-namc_base}
LEASE_SECONDS=${LEASE_SECONDS:-560}
WHEELS=(open_clip_torch==3.3.0 timm==1.0.31 ftfy==6.3.1 wcwidth==0.9.4 taming-transformers-rom1504==0.0.6
    jsonargparse==4.53.0 docstring-parser==0.18.0 typeshed-client==2.15.0)  # the last three: LightningCLI (smoke)

setup() {
    if ! compgen -G "$WHEEL_DIR/*.whl" >/dev/null; then
        echo "gpu_session.sh: no wheels in $WHEEL_DIR: run 'bash tools/gpu_session.sh wheels'" \
            "where pip works and carry $WHEEL_DIR to the GPU machine" >&2
        exit 2
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/namc_site \
        "$WHEEL_DIR"/*.whl
    if [[ -d $WHEEL_DIR/site ]]; then cp -r "$WHEEL_DIR"/site/. /tmp/namc_site/; fi  # the trimmed pycocoevalcap
    export PYTHONPATH="/tmp/namc_site:$PWD" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
    mkdir -p "$OUT"
    python3 -c "import torch, open_clip, timm, taming, namc
print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'namc', namc.__version__,
      torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
}

case "${1:-}" in
wheels)
    # pure-Python wheels, and wcwidth's abi3 build for the machine's Python 3.12 on x86-64
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$WHEEL_DIR" "${WHEELS[@]}"
    # pycocoevalcap (namc[train]: `namc fit` will not start without it) is a 104 MB wheel, over the device's 64 MiB
    # a call: its PTB tokenizer, BLEU, METEOR, ROUGE-L and CIDEr-D travel, not SPICE or METEOR's paraphrase table
    # (62 MB), and no Java is there to run either; put in place beside the wheels' install, not installed
    python3 -m pip download --quiet --no-deps -d /tmp/namc_pycoco pycocoevalcap==1.2
    rm -rf "$WHEEL_DIR/site" && mkdir -p "$WHEEL_DIR/site"
    python3 -m zipfile -e /tmp/namc_pycoco/pycocoevalcap-1.2-py3-none-any.whl "$WHEEL_DIR/site"
    rm -rf "$WHEEL_DIR"/site/pycocoevalcap/spice "$WHEEL_DIR"/site/pycocoevalcap/meteor/data \
        "$WHEEL_DIR"/site/pycocoevalcap-1.2.dist-info
    ls -l "$WHEEL_DIR"; du -sh "$WHEEL_DIR"
    ;;
check)
    setup
    { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"; } |
        tee "$OUT/check.log"
    tests=0
    python3 -m pytest -q -p no:cacheprovider tests/test_static_decode.py tests/test_throughput.py 2>&1 |
        tee -a "$OUT/check.log" || tests=$?
    python3 -m namc.eval.throughput --model namc_tiny --device "$DEVICE" --dtype "$DTYPE" \
        --static-decode --reference clip4idc --batch-sizes 1 64 --modes decode e2e --train-batch-size 16 \
        --train-steps 3 --output "$OUT/tiny.json" 2>&1 | tee -a "$OUT/check.log"
    exit "$tests"  # the benchmark runs even where a test failed; the tests decide the exit status
    ;;
bench)
    setup
    # shellcheck disable=SC2086  # BATCH_SIZES is a list
    timeout "$BENCH_SECONDS" python3 -m namc.eval.throughput --model "$MODEL" --device "$DEVICE" \
        --dtype "$DTYPE" --static-decode --reference clip4idc --batch-sizes $BATCH_SIZES \
        --modes decode e2e --train-batch-size "$TRAIN_BATCH_SIZE" --shortlist "$SHORTLIST" \
        --output "$OUT/$NAME.json" 2>&1 |
        tee "$OUT/$NAME.log"
    ;;
lease)
    setup
    { nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv 2>/dev/null ||
        echo "no nvidia-smi"; } | tee "$OUT/check.log"
    timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_static_decode.py 2>&1 | tee -a "$OUT/check.log" ||
        echo "tests: exit $?" | tee -a "$OUT/check.log"
    part() {  # NAME SECONDS ARGS...: one benchmark process with its own limit and JSON, logged to bench.log
        local name=$1 seconds=$2 left rc=0
        shift 2
        left=$((LEASE_SECONDS - SECONDS))
        ((seconds > left)) && seconds=$left
        ((seconds < 20)) && { echo "$name: skipped, ${left} s of the lease left" | tee -a "$OUT/check.log"; return 0; }
        echo "== $name (limit $seconds s): $*" >>"$OUT/bench.log"
        timeout "$seconds" python3 -m namc.eval.throughput --model "$MODEL" --device "$DEVICE" --dtype "$DTYPE" \
            --shortlist "$SHORTLIST" --gemm-size "${GEMM_SIZE:-8192}" --verbose --output "$OUT/$name.json" "$@" \
            >>"$OUT/bench.log" 2>&1 || rc=$?
        ((rc == 0)) || echo "$name: exit $rc" | tee -a "$OUT/check.log"
        return $rc
    }
    static() {  # NAME SECONDS ARGS...: with --static-decode (CUDA graphs); where that fails outright, eagerly
        local rc=0
        part "$@" --static-decode || rc=$?
        if ((rc != 0 && rc != 124)); then part "$1_eager" "${@:2}" || true; fi
    }
    static small "${SMALL_SECONDS:-150}" --batch-sizes 1 8 64 --modes decode e2e --reference clip4idc
    part train "${TRAIN_SECONDS:-100}" --batch-sizes 1 --modes decode --reference none \
        --train-batch-size "$TRAIN_BATCH_SIZE" --train-steps 5 --train-warmup 2 || true
    static large "${LARGE_SECONDS:-170}" --batch-sizes 256 1024 --modes decode e2e --reference clip4idc
    grep -v "^20..-..-.. ..:..:..,... root: " "$OUT/bench.log" | tail -n 60
    ;;
smoke)
    setup
    { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"; } |
        tee "$OUT/check.log"
    ft=()
    step() {  # NAME SECONDS COMMAND...: logged to smoke.log, its exit status to check.log
        local name=$1 seconds=$2 rc=0 start=$SECONDS
        shift 2
        echo "== $name: $*" >>"$OUT/smoke.log"
        timeout "$seconds" "$@" >>"$OUT/smoke.log" 2>&1 || rc=$?
        echo "$name: exit $rc in $((SECONDS - start)) s" | tee -a "$OUT/check.log"
    }
    demo=/tmp/namc_smoke  # DEMO_COPY: `namc demo --fast --out /tmp/namc_smoke` made elsewhere (its data and configs)
    if [[ -n ${DEMO_COPY:-} ]]; then
        rm -rf "$demo" && cp -r "$DEMO_COPY" "$demo"
    else
        step demo 120 python3 -m namc demo --fast --out "$demo" --quiet
    fi
    accelerator=gpu
    [[ $DEVICE == cuda* ]] || accelerator=cpu  # a dry run
    gpu=(--trainer.accelerator "$accelerator" --trainer.precision bf16-mixed --trainer.enable_progress_bar false)
    # fine-tuning validates with pycocoevalcap's Java tools, METEOR with the paraphrase table the trimmed copy lacks
    if ! command -v java >/dev/null || [[ -d $WHEEL_DIR/site ]] ||
        ! python3 -c "import pycocoevalcap.tokenizer.ptbtokenizer" 2>/dev/null; then
        echo "no java or no whole pycocoevalcap: fine-tuning without validation" | tee -a "$OUT/check.log"
        ft=(--trainer.limit_val_batches 0)
    fi
    step pretrain_gpu 90 python3 -m namc fit --config "$demo/configs/pretrain.yaml" "${gpu[@]}"
    step finetune_gpu 90 python3 -m namc fit --config "$demo/configs/finetune.yaml" "${gpu[@]}" "${ft[@]}"
    if [[ -n ${CAPTION_MODEL:-} && -n ${CAPTION_PAIRS:-} ]]; then
        for run in "cpu fp32" "$DEVICE fp32" "$DEVICE bf16"; do
            read -r device precision <<<"$run"
            step "describe_${device}_$precision" 40 python3 -m namc describe --model "$CAPTION_MODEL" \
                --pairs "$CAPTION_PAIRS" --device "$device" --precision "$precision" \
                --output "$OUT/captions_${device}_$precision.jsonl"
        done
    fi
    grep -E "^(==|namc describe:|Epoch|.*Error)" "$OUT/smoke.log" | tail -n 40
    ;;
*)
    awk 'NR > 1 && /^set /{exit} NR > 1' "$0" >&2
    exit 2
    ;;
esac
