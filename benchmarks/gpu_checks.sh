#!/usr/bin/env bash
# One prepared run of every GPU check (runtime, checkpoint, data) on a GPU machine:
#   benchmarks/gpu_checks.sh OUTDIR
# Python packages the machine lacks can sit as wheels in .whl/ (installed to /tmp/site).
# Writes at most 7 files to OUTDIR: nvidia-smi.txt, ddp.json, ckpt.json, loader.json, errors.txt,
# probe.log, demo.log. Exit 0 only if every check passed.
set -u
out=${1:?usage: benchmarks/gpu_checks.sh OUTDIR}
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 TORCH_CPP_LOG_LEVEL=ERROR
nvidia-smi -L >"$out/nvidia-smi.txt" 2>&1
rc=0
run() { # name, timeout, command...
  local name=$1 limit=$2; shift 2
  echo "== $name" >>"$out/errors.txt"
  local t0=$SECONDS
  timeout "$limit" "$@" >"$out/$name.json" 2>>"$out/errors.txt" || { echo "$name: exit $?" >>"$out/errors.txt"; rc=1; }
  echo "$name took $((SECONDS - t0)) s" >>"$out/errors.txt"
}
run ddp 200 python3 benchmarks/gpu_check_ddp.py --out /tmp/gpu-ddp
cp /tmp/gpu-ddp/probe.log /tmp/gpu-ddp/demo.log "$out/" 2>/dev/null
run ckpt 150 python3 benchmarks/gpu_check_ckpt.py --out /tmp/gpu-ckpt
run loader 150 python3 benchmarks/gpu_check_loader.py --out /tmp/gpu-loader
run sharded 200 python3 benchmarks/gpu_check_sharded.py --out /tmp/gpu-sharded
for f in "$out"/*.json; do echo "--- $f"; cat "$f"; done
exit $rc
