# syntax=docker/dockerfile:1
# One image for every Chorus process: workers, beat, migrations, Flower, metrics.
#   docker build -t chorus:local .      (compose.yaml does this for you)

FROM python:3.11-slim AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# Every dependency ships manylinux wheels: no compiler needed.
RUN python -m venv /opt/venv && /opt/venv/bin/pip install --upgrade pip
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY orchestrator ./orchestrator
COPY workers ./workers
# A regular (non-editable) install: the image does not need the source tree.
RUN /opt/venv/bin/pip install '.[tracing]'


FROM python:3.11-slim

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONPATH=/app \
    LITELLM_LOCAL_MODEL_COST_MAP=True \
    CHORUS_STATE_DIR=/var/lib/chorus

RUN groupadd --system --gid 10001 chorus \
    && useradd --system --uid 10001 --gid chorus --home-dir /app --no-create-home chorus \
    && mkdir -p /app /var/lib/chorus \
    && chown chorus:chorus /app /var/lib/chorus

COPY --from=build /opt/venv /opt/venv

WORKDIR /app
# The demo agents, so CHORUS_MODULES=examples.parallel_tools works out of the box.
# Mount or COPY your own modules next to them (PYTHONPATH=/app).
COPY --chown=chorus:chorus examples ./examples

USER chorus

CMD ["chorus", "--help"]
