# One image for every Kurir process (migrate, api, worker, scheduler).
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 KURIR_DATA_DIR=/var/lib/kurir
RUN apt-get update && apt-get install -y --no-install-recommends curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --create-home --home-dir /var/lib/kurir kurir
WORKDIR /srv/kurir
COPY pyproject.toml README.md alembic.ini ./
COPY app ./app
COPY sender ./sender
COPY dlq ./dlq
COPY migrations ./migrations
RUN pip install --no-cache-dir -e .
USER kurir
EXPOSE 8080
CMD ["kurir", "api", "--host", "0.0.0.0", "--port", "8080"]
