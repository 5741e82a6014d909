"""The floor under publish -> receipt: the same trip as Kurir's, with nothing of Kurir in it.

    python bench/bare_pipeline.py api PORT DATABASE_URL REDIS_URL
    python bench/bare_pipeline.py worker DATABASE_URL REDIS_URL RECEIVER_URL

`bench/everyday.py --floor RATE` runs both beside Kurir, publishing to them the way it
publishes to `kurir api`, and prints their latency and CPU next to Kurir's. What a delivery
cannot avoid on this machine, Kurir or not, is in it:

  api     a Flask app under granian with `kurir api`'s workers and threads; per publish it
          parses the JSON body, writes one row in its own committed PostgreSQL transaction
          (durable: a WAL flush, as a publish is) and RPUSHes the row's id to a Redis list
  worker  a process that BLPOPs an id and POSTs a body to the receiver over a kept-alive
          urllib3 connection, then pops the next

No validation, fan-out, idempotency, claim, lease, signing or outcome record: what Kurir adds
to a delivery's latency is its figure minus this one.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import uuid
from typing import Any

QUEUE = "kurir-bench:bare-pipeline"
TABLE = "bare_pipeline_events"


def make_app(database_url: str, redis_url: str) -> Any:
    """The bare publish endpoint: one committed INSERT and one RPUSH per request."""
    import psycopg
    import redis
    from flask import Flask, jsonify, request

    app = Flask("bare_pipeline")
    local = threading.local()
    queue = redis.Redis.from_url(redis_url)

    def connection() -> Any:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = psycopg.connect(database_url.replace("+psycopg", ""))
        return conn

    @app.post("/v1/partners/<uid>/events")
    def publish(uid: str) -> Any:
        body = request.get_json()
        event_id = f"bare_{uuid.uuid4().hex}"
        conn = connection()
        with conn.transaction():
            conn.execute(
                f"INSERT INTO {TABLE} (id, partner, body) VALUES (%s, %s, %s)",  # noqa: S608
                (event_id, uid, json.dumps(body)),
            )
        queue.rpush(QUEUE, event_id)
        return jsonify({"id": event_id}), 202

    return app


def prepare(database_url: str, redis_url: str) -> None:
    """The table the app writes and an empty queue."""
    import psycopg
    import redis

    with psycopg.connect(database_url.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {TABLE} "
            "(id text PRIMARY KEY, partner text, body jsonb, created_at timestamptz DEFAULT now())"
        )
    redis.Redis.from_url(redis_url).delete(QUEUE)


def serve(port: int, database_url: str, redis_url: str, workers: int, threads: int) -> None:
    """granian as `kurir api` runs it: WSGI, HTTP/1, `workers` x `threads`."""
    from functools import partial

    from granian.constants import HTTPModes, Interfaces
    from granian.log import LogLevels
    from granian.server import Server

    server = Server(
        "bare",
        address="127.0.0.1",
        port=port,
        interface=Interfaces.WSGI,
        http=HTTPModes.http1,
        websockets=False,
        workers=workers,
        blocking_threads=threads,
        log_level=LogLevels.warning,
    )
    server.serve(target_loader=partial(make_app, database_url, redis_url), wrap_loader=False)


def work(redis_url: str, receiver_url: str) -> None:
    """BLPOP an id, POST it to the receiver, forever."""
    from urllib.parse import urlsplit

    import redis
    import urllib3

    queue = redis.Redis.from_url(redis_url)
    parts = urlsplit(receiver_url)
    pool = urllib3.HTTPConnectionPool(parts.hostname, parts.port, maxsize=1)
    body = json.dumps({"type": "order.paid", "data": {"order_id": "ord_1"}}).encode()
    while True:
        popped = queue.blpop([QUEUE], timeout=1)
        if popped is None:
            continue
        headers = {"content-type": "application/json", "webhook-id": popped[1].decode()}
        pool.urlopen("POST", "/bare", body=body, headers=headers, retries=False)


def main() -> None:
    role = sys.argv[1]
    if role == "api":
        port, database_url, redis_url = int(sys.argv[2]), sys.argv[3], sys.argv[4]
        workers = int(os.environ.get("KURIR_API_WORKERS", "2"))
        threads = int(os.environ.get("KURIR_API_THREADS", "8"))
        serve(port, database_url, redis_url, workers, threads)
    elif role == "worker":
        work(sys.argv[3], sys.argv[4])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
