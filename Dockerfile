# One image for every toolfence process of docker-compose.yml (migrate, relay,
# worker, reconciler, exporter); the command picks the role.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Sources first, then one install: psycopg[binary] and the rest come as wheels,
# so the image needs no compiler.
COPY pyproject.toml README.md ./
COPY executor ./executor
COPY outbox ./outbox
COPY reconciler ./reconciler
COPY ledger ./ledger
RUN pip install .

COPY ops/docker/entrypoint.sh /usr/local/bin/toolfence-entrypoint
# An unprivileged user; the metrics directory is created here so that a fresh
# named volume mounted on it inherits this owner.
RUN chmod 0755 /usr/local/bin/toolfence-entrypoint \
    && useradd --system --uid 10001 --home-dir /app toolfence \
    && mkdir -p /var/lib/toolfence/metrics \
    && chown toolfence /var/lib/toolfence/metrics
USER toolfence

ENTRYPOINT ["toolfence-entrypoint"]
CMD ["toolfence", "--help"]
