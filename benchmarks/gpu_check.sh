#!/usr/bin/env bash
# The GPU check of issue 40 (benchmarks/gpu_check.py says what it runs), for a GPU machine that holds
# torch and transformers but maybe none of draftrl's other dependencies, and has no network: draftrl
# runs from this checkout (PYTHONPATH), the wheels below travel in .whl/ (git-ignored), no model
# weights travel (random weights are made on the GPU and saved there).
#
#   bash benchmarks/gpu_check.sh --wheels                   # the wheels to carry, one per line
#   bash benchmarks/gpu_check.sh --download-wheels [NAME..]  # where pip reaches PyPI: them (or those named) into .whl/
#   bash benchmarks/gpu_check.sh --out DIR [--overwrite] [gpu_check.py flags]   # on the GPU machine
#   bash benchmarks/gpu_check.sh --cpu --out DIR            # the dry run: the same steps, tiny shapes, on a CPU
#
# All of them, for a machine with torch and transformers alone: 63.0 MB (62.5 MB measured with
# --download-wheels before accelerate and psutil joined, which add 0.54 MB). A machine that holds some (this workplace's lent H100 lists all but gymnasium,
# Farama-Notifications, stable-baselines3 and tzdata: 1.02 MB) needs only the others: the script
# installs each wheel of .whl/ whose distribution the machine lacks (pip --no-index --no-deps into a
# folder of its own, $DRAFTRL_SITE, default /tmp/draftrl_site) and runs with WANDB_MODE=disabled and
# HF_HUB_OFFLINE=1.
#
# The dry run (--cpu) first builds a Python that holds only torch, transformers, pip and what they
# require (linked from $PYTHON) and runs in it, so an import that the carried wheels do not cover
# fails here as it would there. It installs the wheels of .whl/ that fit this Python and links the
# other carried distributions from $PYTHON (scipy's and matplotlib's wheels are built for the GPU
# machine's Python 3.12).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
DRY=""  # the dry run's Python, a temporary folder
# What the check imports beyond torch, transformers and their requirements, with what those require:
# the RL stack, scipy (the exactness monitor), accelerate (transformers' device_map: the multi-GPU
# step's split target), matplotlib (grid's and eval's plots), pytest; the versions draftrl's tests ran
# with here.
WHEELS=(gymnasium==1.4.0 farama-notifications==0.0.6 cloudpickle==3.1.3 stable-baselines3==2.9.2
        scipy==1.17.1 accelerate==1.16.0 psutil==7.2.2
        matplotlib==3.11.2 contourpy==1.3.3 cycler==0.12.1 fonttools==4.69.1 kiwisolver==1.5.1 pillow==13.0.0
        pyparsing==3.3.3 python-dateutil==4.0.0 tzdata==2026.6
        pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1)

case "${1:-}" in
  --wheels)
    printf '%s\n' "${WHEELS[@]}"
    exit 0 ;;
  --download-wheels)
    shift
    CHOSEN=()
    for name in "$@"; do
      spec=$(printf '%s\n' "${WHEELS[@]}" | grep -i "^$name==") \
        || { echo "--download-wheels: $name is not among the wheels (bash $0 --wheels lists them)" >&2; exit 2; }
      CHOSEN+=("$spec")
    done
    ((${#CHOSEN[@]})) || CHOSEN=("${WHEELS[@]}")
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d .whl "${CHOSEN[@]}"
    ls -l .whl/*.whl
    du -cb .whl/*.whl | tail -n 1
    exit 0 ;;
esac

if [[ " $* " == *" --cpu "* ]]; then
  DRY=$(mktemp -d -t gpu_check_python.XXXXXX)
  trap 'rm -rf "$DRY"' EXIT
  PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" benchmarks/gpu_check.py --device-python "$DRY" \
    --carried "${WHEELS[@]%%==*}"
  PYTHON="$DRY/bin/python"
  export PYTHONNOUSERSITE=1
  unset PYTHONPATH
fi

if compgen -G ".whl/*.whl" >/dev/null; then
  SITE=${DRAFTRL_SITE:-${DRY:-/tmp}/draftrl_site}
  # the wheels whose distribution this Python lacks (one found is used as it is: a second copy of
  # pytest beside the machine's own would run under its plugins)
  mapfile -t MISSING < <("$PYTHON" - .whl/*.whl <<'EOF'
import sys
from importlib import metadata
from pathlib import Path

found = []
for wheel in sys.argv[1:]:
    name = Path(wheel).name.split("-")[0]
    try:
        found.append(f"{name} {metadata.version(name)}")
    except metadata.PackageNotFoundError:
        print(wheel)
if found:
    print(f"# found here, not installed: {', '.join(found)}", file=sys.stderr)
EOF
)
  if ((${#MISSING[@]})); then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${MISSING[@]}"
    echo "# installed into $SITE: ${MISSING[*]##*/}"
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" WANDB_MODE=disabled HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export GPU_CHECK_WHEELS="${WHEELS[*]}"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
"$PYTHON" benchmarks/gpu_check.py "$@"
