#!/usr/bin/env bash
# Multi-GPU validation (issue 8): fault-injection campaigns under the SCOUT replay harness
# and the harness's step-time overhead, one process per GPU with NCCL.
#
#   scripts/multi_gpu_check.sh [STAGE...]     (default: nccl gloo overhead)
#     nccl      DDP, FSDP2 and HSDP (dp_replicate=2) campaigns on NCCL, one rank per GPU, scored
#     gloo      with fewer than 3 GPUs: the full campaigns on gloo, several ranks per GPU
#     overhead  harness step-time overhead per cadence (off, 100, 10, 1) + signature throughput
#     tests     the GPU tests of the pipelined and deterministic replay
#
# Same machine requirements as scripts/gpu_check.sh (it builds the package first, unless
# LMR_SKIP_BUILD=1). Results go to $OUT (default ./gpu-results) as multi-gpu.tgz plus a log.
#
# With 3 or more GPUs the campaigns run on NCCL with the full manifests (localization needs a
# strict majority of replicas). With 2 GPUs, two replicas can never outvote each other: the
# NCCL runs use the 2-rank manifests (expect Inconclusive in each fault window, agreement
# elsewhere), and the full manifests run on gloo with several ranks per GPU instead.
set -uo pipefail
cd "$(dirname "$0")/.."
stages=${*:-nccl gloo overhead}
has() { [[ " $stages " == *" $1 "* ]]; }
out=${OUT:-$PWD/gpu-results}
results=$PWD/gpu-results/multi-gpu
rm -rf "$results" && mkdir -p "$results" "$out"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
status=0
step() {
  local name=$1; shift
  echo "== $name: $*"
  if ! timeout "${LMR_STEP_TIMEOUT:-300}" bash -c '"$@"' _ "$@" >"$results/$name.log" 2>&1; then echo "!! failed: $name"; status=1; fi
  tail -n 30 "$results/$name.log"
}

# A campaign run whose localization is expected to stay empty: exit status 0 when its
# report says no check attributed anything (the run's last argument is its --out folder).
unattributed() {
  "$@"
  grep -q "attributions: none" "${@: -1}/report.txt" && ! grep -q "^  .*Attributed" "${@: -1}/report.txt"
}
export -f unattributed

if [ "${LMR_SKIP_BUILD:-0}" != 1 ]; then
  prefix=$PWD/.device/root
  for deb in .device/debs/*.deb; do [ -e "$deb" ] && dpkg -x "$deb" "$prefix"; done
  export CMAKE_PREFIX_PATH=$prefix/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  python3 -m pip install --no-build-isolation --no-deps -q . -Cbuild-dir=build-gpu -Ccmake.define.LMR_CUDA=ON \
    -Ccmake.define.CMAKE_CUDA_ARCHITECTURES="${LMR_CUDA_ARCH:-90}" >"$results/build.log" 2>&1 \
    || { tail -n 40 "$results/build.log"; exit 1; }
fi
gpus=$(nvidia-smi -L | wc -l)
{
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
"nccl", ".".join(map(str, torch.cuda.nccl.version())))'
  nvidia-smi topo -m
} >"$results/device.txt" 2>&1
cat "$results/device.txt"
torchrun="python3 -m torch.distributed.run --standalone --nproc-per-node $gpus"
# A model that keeps an H200 busy for the NCCL runs; two layers keep the campaigns' 4-step
# fault windows long enough for the hidden-layer rotation (see bench/multi_gpu_campaign.py).
big="--device cuda --dim 2048 --layers 2 --heads 16 --seq 1024 --batch 8 --vocab 32000"
small="--device cuda --backend gloo --dim 512 --layers 2 --heads 8 --seq 256 --batch 8 --vocab 8192"
campaign="bench/multi_gpu_campaign.py"
examples=examples/campaigns

if has tests; then
  step tests python3 -m pytest -q -p no:cacheprovider -m gpu tests/python/test_scout_pipelined.py \
    tests/python/test_scout_determinism.py
fi
if has nccl; then
  run=""
  if [ "$gpus" -ge 3 ]; then
    ddp=$examples/multi-gpu-ddp.json; sharded=$examples/multi-gpu-sharded.json
  else  # nothing can be localized by two replicas: pass when nothing was attributed
    ddp=$examples/multi-gpu-2rank-ddp.json; sharded=$examples/multi-gpu-2rank-sharded.json
    run=unattributed
  fi
  step nccl_ddp $run $torchrun $campaign --parallel ddp $big --campaign "$ddp" --out "$results/nccl_ddp"
  step nccl_fsdp2 $run $torchrun $campaign --parallel fsdp2 $big --campaign "$sharded" --out "$results/nccl_fsdp2"
  step nccl_hsdp $run $torchrun $campaign --parallel hsdp --dp-replicate 2 $big --campaign "$sharded" \
    --out "$results/nccl_hsdp"
fi
if has gloo && [ "$gpus" -lt 3 ]; then  # strict majorities on the same GPUs: several gloo ranks per GPU
  for mode in ${LMR_GLOO_MODES:-ddp fsdp2 hsdp}; do
    case $mode in
      ddp) args="--world-size 6 --campaign $examples/multi-gpu-ddp.json" ;;
      *) args="--world-size 4 --dp-replicate 2 --campaign $examples/multi-gpu-sharded.json" ;;
    esac
    step "gloo_$mode" python3 $campaign --parallel "$mode" $args $small --out "$results/gloo_$mode"
  done
fi
if has overhead; then
  step overhead $torchrun bench/scout_overhead.py --device cuda --dim 2048 --layers 16 --heads 16 --seq 1024 \
    --batch 8 --vocab 32000 --dtype bfloat16 --rounds "${LMR_ROUNDS:-3}" --steps "${LMR_STEPS:-30}" \
    --cadences 0,100,10,1
fi
tar czf "$out/multi-gpu-${stages// /-}.tgz" -C "$results" .
exit $status
