#!/usr/bin/env bash
# The device check, one call on a lent GPU machine (no registry there; its own CUDA torch):
#   the CUDA tests, the DLRM GPU benchmark (NVIDIA's "small" configuration) in graph bf16 / graph fp32 / eager bf16,
#   then the whole test suite under that machine's torch (pytest-xdist; tests whose optional packages are absent skip).
# Usage (repo root): bash benchmarks/gpu_session.sh     -> everything also lands in $OUT/log (or /tmp/gpu_out/log)
set -u
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=src
log() { tee -a "$OUT/log"; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 | log
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" 2>&1 | log
echo "== tests/test_cuda.py" | log
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py 2>&1 | tail -20 | log
for args in "--mode graph --precision bf16" "--mode graph --precision fp32" "--mode eager --precision bf16 --steps 30"; do
  echo "== dlrm_gpu.py $args" | log
  timeout 150 python3 benchmarks/dlrm_gpu.py $args 2>&1 | tail -4 | log
done
echo "== full suite, ${SUITE_S:-200} s at most" | log
timeout "${SUITE_S:-200}" python3 -m pytest -q -p no:cacheprovider -n 14 --timeout 120 -rfE 2>&1 | grep -v "^\.\|^$" | tail -60 | log
