#!/usr/bin/env bash
# Every GPU check (runtime, checkpoint, data, the Trainer under FSDP) in one run on a GPU machine:
#   benchmarks/gpu_checks.sh OUTDIR
# Python packages the machine lacks can sit as wheels in .whl/ (installed to /tmp/site).
# Writes to OUTDIR: nvidia-smi.txt, <check>.json (each check's result), <check>.err, and the DDP
# check's job logs under OUTDIR/ddp/. Exit 0 only if every check passed; a check's exit 2 (CUDA not
# available) counts as skipped only when this machine has no CUDA, and then this script exits 2.
set -u
out=${1:?usage: benchmarks/gpu_checks.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 TORCH_CPP_LOG_LEVEL=ERROR
nvidia-smi -L >"$out/nvidia-smi.txt" 2>&1
if python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then cuda=1; else cuda=0; fi
failed=0 skipped=0
run() { # name, time limit (s), command...
  local name=$1 limit=$2 rc t0=$SECONDS
  shift 2
  timeout "$limit" "$@" >"$out/$name.json" 2>"$out/$name.err"
  rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "PASS $name ($((SECONDS - t0)) s)"
  elif [ "$rc" -eq 3 ]; then # CUDA, but fewer GPUs than the check needs: said so, not a failure
    echo "SKIP $name: $(tail -n 1 "$out/$name.err")"
  elif [ "$rc" -eq 2 ] && [ "$cuda" -eq 0 ]; then
    echo "SKIP $name: $(tail -n 1 "$out/$name.err")"
    skipped=1
  else
    echo "FAIL $name: exit $rc ($((SECONDS - t0)) s); see $out/$name.json and $out/$name.err"
    failed=1
  fi
}
run ckpt 300 python3 benchmarks/gpu_check_ckpt.py --out "$out/ckpt"
run loader 300 python3 benchmarks/gpu_check_loader.py --out "$out/loader"
run sharded 300 python3 benchmarks/gpu_check_sharded.py --out "$out/sharded"
run ddp 600 python3 benchmarks/gpu_check_ddp.py --out "$out/ddp"
run trainer 900 python3 benchmarks/gpu_check_trainer.py --out "$out/trainer"
# In-job recovery on NCCL (hpctrain.runtime.recovery): 2 ranks and a warm spare, one GPU each; a rank SIGKILLed
# mid-step, the survivor's communicator aborted (CleanUpOnly), the CUDA context kept, the state sent device to
# device; exits 1 unless the final parameters equal an uninterrupted run's, 3 with fewer than 3 GPUs.
run recovery 600 python3 benchmarks/bench_recovery.py --backend nccl --world 2 --steps 20 --kill-at 12 --ckpt-every 5
if [ "$failed" -ne 0 ]; then exit 1; fi
if [ "$skipped" -ne 0 ]; then exit 2; fi
exit 0
