#!/usr/bin/env bash
# One prepared run on a lent GPU machine (device tool), for the "does it matter" study (notebook 06).
# Run from the repository root with OUT set to the folder that comes back, and the token streams
# carried in .gpu/tokens.pt (python -m analysis train runs on the GPU's own Python, whose standard
# library differs from the one the tokenizer was trained on). Every step has its own time limit and
# writes its files as it goes, so a step that overruns costs only itself.
#   1. the CUDA tests (tests/lce/test_cuda.py), unless SKIP_TESTS=1;
#   2. python -m analysis noise --device cuda: error against sampling noise on the real cuBLAS kernels;
#   3. python -m analysis train --device cuda: the training study's full setting, for TRAIN_ARMS and
#      TRAIN_SEEDS (default: every arm, seed 0), into TRAIN_FILE.
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

[ "${SKIP_TESTS:-0}" = 1 ] || step cuda-tests "${TESTS_S:-100}" python3 -m pytest -q -p no:cacheprovider tests/lce/test_cuda.py
[ "${SKIP_NOISE:-0}" = 1 ] || step noise "${NOISE_S:-110}" python3 -m analysis noise --device cuda --results "$OUT" --no-progress
step train "${TRAIN_S:-300}" python3 -m analysis train --device cuda --tokens .gpu/tokens.pt --cache /tmp/lm \
  --results "$OUT" --file "${TRAIN_FILE:-training_cuda.csv}" --seed-list "${TRAIN_SEEDS:-0}" \
  ${TRAIN_ARMS:+--arms "$TRAIN_ARMS"} --budget-s "${TRAIN_BUDGET_S:-240}" --no-progress
[ -z "${TRAIN2_ARMS:-}" ] || step train2 "${TRAIN2_S:-200}" python3 -m analysis train --device cuda \
  --tokens .gpu/tokens.pt --cache /tmp/lm --results "$OUT" --file "${TRAIN2_FILE:-training_cuda_2.csv}" \
  --seed-list "${TRAIN2_SEEDS:-1}" --arms "$TRAIN2_ARMS" --budget-s "${TRAIN2_BUDGET_S:-150}" --no-progress
echo "== $(date -u +%FT%TZ) done" | tee -a "$log"
