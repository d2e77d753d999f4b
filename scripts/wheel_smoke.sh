#!/usr/bin/env bash
# Check an lm_resiliency wheel as a user without a compiler would meet it:
#   1. every ELF file in it needs only libraries of the manylinux allowlist (the C library,
#      libm, libgcc_s and the loader): nothing of Gloo, libstdc++ or CUDA from the system;
#   2. a fresh venv with nothing but the pinned torch (LMR_SMOKE_TORCH, default torch==2.13.0),
#      then the wheel with the dependencies it declares;
#   3. with no compiler, headers or development libraries visible (a private mount namespace
#      hides them where unshare is allowed) and nothing of this checkout on any path:
#      `lmr version` (the wheel's version), `lmr-oobd --help`, an import of every module of the
#      package, and a short `lmr-qualify` run (3 CPU ranks, one fault family, localized).
# Usage: scripts/wheel_smoke.sh dist/lm_resiliency-<version>-<tags>.whl
# Exit status 0 when every check passed. PYTHON (default .venv/bin/python) reads the ELF files.
# Where no package index can be reached (the GPU machine), LMR_SMOKE_SYSTEM_TORCH=1 makes the venv
# see the system's torch and numpy instead of installing them, and LMR_SMOKE_GPU_TESTS then runs
# GPU-marked tests with the installed wheel: 1 for all of tests/python, or the test files to run.
set -euo pipefail
[ $# -eq 1 ] && [ -f "$1" ] || { echo "usage: $0 WHEEL (one .whl file)" >&2; exit 2; }
wheel=$(realpath "$1")
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$here/.venv/bin/python}
torch_pin=${LMR_SMOKE_TORCH:-torch==2.13.0}
version=$(basename "$wheel" | cut -d- -f2)
work=$(mktemp -d "${TMPDIR:-/tmp}/lmr-wheel-XXXXXX")
# LMR_SMOKE_KEEP=1 keeps the venv and the logs.
[ "${LMR_SMOKE_KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
start=$(date +%s)

echo "== $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB), version $version"
"$python" -m auditwheel show "$wheel" | tr '\n' ' ' | sed 's/  */ /g'; echo
"$python" "$here/scripts/packaging/elf_needs.py" "$wheel"

quiet() { "$@" 2>&1 | { grep -v "^WARNING: Location" || true; }; return "${PIPESTATUS[0]}"; }
if [ "${LMR_SMOKE_SYSTEM_TORCH:-0}" = 1 ]; then
  # python3's own packages through a .pth file: --system-site-packages would show the base
  # interpreter's, not those of a venv python3 may itself be (as on the GPU machine's image).
  echo "== fresh venv over python3's packages (its torch), then the wheel (no index)"
  python3 -m venv "$work/venv"
  python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
    > "$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/system-packages.pth"
  quiet "$work/venv/bin/pip" install -q --no-index --no-deps "$wheel"
else
  echo "== fresh venv: $torch_pin, then the wheel"
  python3 -m venv "$work/venv"
  quiet "$work/venv/bin/pip" install -q "$torch_pin"
  quiet "$work/venv/bin/pip" install -q "$wheel"
fi
"$work/venv/bin/pip" list 2>/dev/null | grep -iE "^(torch|numpy|lm.resiliency) " | tr -s ' ' | paste -sd ';' 

# The checks, in $work, with a scrubbed environment: PATH has the venv and the base system only.
cat > "$work/checks.sh" <<'EOF'
set -euo pipefail
cd "$WORK"
lmr version | tee version.txt
grep -q "^lmr $VERSION " version.txt || { echo "lmr version does not say $VERSION"; exit 1; }
lmr-oobd --help > oobd-help.txt
python - <<'PY'
import importlib, os, pkgutil, sys
import lm_resiliency
assert lm_resiliency.__version__ == os.environ["VERSION"], lm_resiliency.__version__
assert os.path.realpath(lm_resiliency.__file__).startswith(os.path.realpath(os.environ["WORK"])), lm_resiliency.__file__
# Every module but the __main__ ones (importing those runs their command).
names = [m.name for m in pkgutil.walk_packages(lm_resiliency.__path__, "lm_resiliency.")
         if not m.name.endswith(".__main__")]
failed = []
for name in names:
    try:
        importlib.import_module(name)
    except Exception as error:  # noqa: BLE001 - every failure is reported
        failed.append(f"{name}: {type(error).__name__}: {error}")
print(f"imported {len(names) - len(failed)} of {len(names)} modules of lm_resiliency {lm_resiliency.__version__}")
sys.exit("\n".join(failed) if failed else 0)
PY
lmr-qualify --ranks 3 --families sdc_gradient --plain --no-plots --out qualify --timeout 300 > qualify.log 2>&1 \
  || { tail -30 qualify.log; tail -40 qualify/runs/*/torchrun.log; exit 1; }
tail -3 qualify.log
EOF
hide=(/usr/include /usr/local/include /usr/lib/gcc /usr/local/cuda /usr/share/cmake /usr/lib/cmake)
isolated() {
  if unshare -m true 2>/dev/null; then
    echo "hidden: ${hide[*]}, /usr/lib/libgloo.so*"
    unshare -m bash -c 'for d in "$@"; do [ -d "$d" ] && mount -t tmpfs none "$(realpath "$d")"; done
      for f in /usr/lib/libgloo.so* /usr/local/bin/nvcc; do [ -e "$f" ] && mount --bind /dev/null "$f"; done
      ! command -v c++ >/dev/null || ! echo "int main(){}" | c++ -x c++ - -o /dev/null 2>/dev/null \
        || { echo "a C++ compiler still works"; exit 1; }
      exec bash "$WORK/checks.sh"' _ "${hide[@]}"
  else
    echo "note: no private mount namespace here (unshare -m refused): checks run with the system visible"
    bash "$WORK/checks.sh"
  fi
}
echo "== checks in $work"
env -i HOME="$work" PATH="$work/venv/bin:/usr/bin:/bin" WORK="$work" VERSION="$version" \
  OMP_NUM_THREADS=1 bash -c "$(declare -p hide); $(declare -f isolated); isolated"
gpu_tests=${LMR_SMOKE_GPU_TESTS:-0}
if [ "$gpu_tests" != 0 ]; then
  [ "$gpu_tests" = 1 ] && gpu_tests=tests/python
  echo "== the GPU tests with the wheel installed: $gpu_tests"
  # shellcheck disable=SC2086 # a list of test files
  (cd "$here" && "$work/venv/bin/python" -m pytest -q -p no:cacheprovider -m gpu $gpu_tests)
fi
echo "== wheel smoke test passed in $(( $(date +%s) - start )) s"
