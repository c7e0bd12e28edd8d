#!/usr/bin/env bash
# Is minipar's CUDA path right, and how fast is it? On a machine with one GPU, < 8 minutes.
#
#   bash benchmarks/gpu_check.sh [--out DIR]         # on a CUDA machine (default DIR: gpu_check_out)
#   bash benchmarks/gpu_check.sh --cpu [--out DIR]   # the same steps, tiny, on the CPU: a smoke
#                                                    # test of this script (tests/test_gpu_check.py)
# Steps, each under a time limit, each recorded in DIR/steps.tsv (name, exit status, seconds):
#   0. python  the first of $PYTHON, .venv/bin/python, python3 whose torch sees a GPU, as it
#              is: a GPU image's CUDA torch is never replaced. minipar comes from this
#              repository's files (pip install --no-deps -e ., else PYTHONPATH). If no Python
#              sees a GPU: a fresh .venv-gpu with `pip install torch==2.13.0` (PyPI's Linux
#              wheel is the CUDA build) and `pip install -e '.[test]'` (needs the network).
#   1. tests   tests/test_device.py with MINIPAR_DEVICE=cuda: the model, the TP layers and CP's
#              attention at one rank (a world of one over NCCL), bf16 autocast against fp32
#   2. train   python -m minipar.train --model llama3.2-1b --dtype bf16: 30 steps, tokens/s, MFU
#   3. mfu     benchmarks/gpu_mfu.py --profile: the same model's step alone (torch.compile'd
#              blocks), then one profiled step: its top operators by GPU time
#   4. summary DIR/summary.json: one object with the machine, each step's result, the test
#              counts, the training's tokens/s and MFU (PaLM's convention), gpu_mfu's table
# One GPU runs NCCL with one rank only: this says nothing about several GPUs talking.
set -uo pipefail
cd "$(dirname "$0")/.."

MODE=cuda
OUT=gpu_check_out
while [ $# -gt 0 ]; do
    case "$1" in
        --cpu) MODE=cpu ;;
        --out) OUT="$2"; shift ;;
        *) echo "gpu_check.sh: unknown argument $1 (use --cpu, --out DIR)" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$OUT" && rm -f "$OUT"/{steps.tsv,tests.xml,train.jsonl,mfu.json,summary.json}
export PYTHONUNBUFFERED=1

# run NAME LIMIT_S CMD...: one step, its output in DIR/NAME.log, its result in steps.tsv
run() {
    local name=$1 limit=$2 t0=$EPOCHREALTIME
    shift 2
    echo "=== $name: $*"
    timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    local status=${PIPESTATUS[0]}
    printf '%s\t%s\t%s\n' "$name" "$status" "$(awk "BEGIN {print $EPOCHREALTIME - $t0}")" >> "$OUT/steps.tsv"
    [ "$status" = 0 ] || echo "=== $name FAILED (exit status $status; 124: over its ${limit} s)"
}

# ---- 0. python
sees() { "$1" benchmarks/gpu_check.py probe 2>/dev/null; }
PY=""
for cand in ${PYTHON:-} .venv/bin/python python3; do
    command -v "$cand" >/dev/null 2>&1 || continue
    if [ "$MODE" = cpu ]; then
        "$cand" -c "import torch" 2>/dev/null && { PY=$cand; break; }
    elif [[ "$(sees "$cand")" == cuda* ]]; then
        PY=$cand; break
    fi
done
if [ -z "$PY" ] && [ "$MODE" = cuda ]; then
    echo "no Python here sees a GPU: installing torch 2.13.0 and minipar into .venv-gpu"
    python3 -m venv .venv-gpu && .venv-gpu/bin/python -m pip install -q torch==2.13.0 \
        && .venv-gpu/bin/python -m pip install -q -e '.[test]' && PY=.venv-gpu/bin/python
    [[ -n "$PY" && "$(sees "$PY")" == cuda* ]] || {
        echo "gpu_check.sh: no CUDA GPU is visible to torch on this machine (run with --cpu for the smoke test)" >&2
        exit 1; }
fi
[ -n "$PY" ] || { echo "gpu_check.sh: no Python with torch found (set PYTHON=...)" >&2; exit 1; }
"$PY" -c "import minipar" 2>/dev/null \
    || "$PY" -m pip install -q --no-deps --no-build-isolation -e . 2>/dev/null \
    || export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
echo "python: $PY ($("$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)')); $(sees "$PY")"

# ---- 1-3. the checks
if [ "$MODE" = cuda ]; then
    TRAIN=(--model llama3.2-1b --steps 30 --global-batch 8 --seq-len 2048 --microbatches 2
           --lr 3e-4 --warmup-steps 5)
    MFU=(--steps 20 --profile)
else
    TRAIN=(--model tiny --steps 5)
    MFU=()
fi
MINIPAR_DEVICE=$MODE run tests 150 "$PY" -m pytest tests/test_device.py -q -p no:cacheprovider \
    --junitxml "$OUT/tests.xml"
run train 240 "$PY" -m minipar.train "${TRAIN[@]}" --dtype bf16 --log-json "$OUT/train.jsonl" --no-progress
run mfu 200 "$PY" benchmarks/gpu_mfu.py "${MFU[@]}" --json "$OUT/mfu.json"

# ---- 4. the summary
"$PY" benchmarks/gpu_check.py summary "$OUT" "$MODE"
