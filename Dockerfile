# rlbench on a GPU runner: vLLM's CUDA image (torch + CUDA + vllm), rlbench installed on top.
# Build: docker build -t rlbench .    Smoke check: docker run --gpus all rlbench  (runs `rlbench doctor`)
ARG VLLM_IMAGE=vllm/vllm-openai:v0.11.0
FROM ${VLLM_IMAGE}

WORKDIR /opt/rlbench
COPY pyproject.toml README.md ./
COPY rlbench ./rlbench
COPY reference_trainer ./reference_trainer
COPY suites ./suites
COPY benchmarks ./benchmarks
# The image's torch satisfies rlbench's torch range, so pip keeps it (no second CUDA stack).
RUN pip install --no-cache-dir -e ".[dev]" && rlbench --help >/dev/null

ENV RLBENCH_CACHE_DIR=/opt/rlbench/.cache
ENTRYPOINT []
CMD ["rlbench", "doctor"]
