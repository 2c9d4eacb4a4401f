#!/usr/bin/env bash
# One prepared run on a lent GPU machine (device tool), for the "does it matter" study (notebook 06).
# Run from the repository root with OUT set to the folder that comes back, and the token streams
# carried in .gpu/tokens.pt (python -m analysis train runs on the GPU's own Python, whose standard
# library differs from the one the tokenizer was trained on). Every step has its own time limit and
# writes its files as it goes, so a step that overruns costs only itself.
#   1. the CUDA tests (tests/test_cuda.py);
#   2. python -m analysis noise --device cuda: error against sampling noise on the real cuBLAS kernels;
#   3. python -m analysis train --device cuda: the training study's full setting, seed by seed.
set -u
: "${OUT:?set OUT to the output folder}"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
log="$OUT/session.log"
{
  echo "== $(date -u +%FT%TZ) start; revision ${LCE_LAB_REVISION:-unknown}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'
} 2>&1 | tee "$log"

step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  local started=$SECONDS
  echo "== $name (limit ${limit}s)" | tee -a "$log"
  timeout "$limit" "$@" 2>&1 | tee -a "$log" | tail -n 40
  echo "== $name: exit ${PIPESTATUS[0]} after $((SECONDS - started))s" | tee -a "$log"
}

step cuda-tests "${TESTS_S:-100}" python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py
step noise "${NOISE_S:-110}" python3 -m analysis noise --device cuda --results "$OUT" --no-progress
step train "${TRAIN_S:-300}" python3 -m analysis train --device cuda --tokens .gpu/tokens.pt --cache /tmp/lm \
  --results "$OUT" --budget-s "${TRAIN_BUDGET_S:-240}" --no-progress
echo "== $(date -u +%FT%TZ) done" | tee -a "$log"
