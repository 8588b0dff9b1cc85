#!/usr/bin/env bash
# One prepared GPU check: CUDA tests, throughput, losses at scale, host syncs (gpu_check.py).
#
#   benchmarks/gpu_check.sh            on a machine with CUDA: about 8 minutes on one H200
#   benchmarks/gpu_check.sh --dry-run  the same script on the CPU at tiny sizes (make test)
#
# Writes gpu_check.md and gpu_check.json to $OUT if set, else runs/gpu_check/. The GraphCL part
# reads runs/gpu_check_inputs/molecules.pt: it is featurised here first when missing (needs
# rdkit); on a GPU machine without rdkit, carry that folder along. Python: $PYTHON, else
# .venv/bin/python, else python3. The check is killed after 480 s; its report is written after
# every part, so what ran is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
if [ ! -f runs/gpu_check_inputs/molecules.pt ]; then
  "$PY" benchmarks/gpu_check.py --prepare \
    || echo "gpu_check.sh: no molecules prepared; the GraphCL parts will report it" >&2
fi
export PYTHONUNBUFFERED=1
exec timeout --signal=TERM --kill-after=10 480 "$PY" benchmarks/gpu_check.py "$@"
