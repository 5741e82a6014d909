"""What one `/metrics` render costs the database on a large history, against counting it.

    BENCH_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/kurir_month \\
        .venv/bin/python bench/metrics_render.py [--repeat 5]

Reads a database that already holds history (e.g. what `bench/lifecycle.py` left); it is
upgraded to the latest migration, and the attempt totals are folded once (the scheduler's
`fold-attempt-totals` job; the first fold reads every attempt once, a day per transaction).
Then, alternating, `--repeat` times each:

  counted    what a render read before the totals: deliveries, dead letters and inbound
             events grouped by state over the whole tables, and every attempt aggregated
             (the bare baseline: exact, and reading the history whole)
  render     `app.services.metrics.database`, what a scrape runs now

Each prints wall time per render (p50 and max) and this process's CPU per render; the
database's own work is the difference (the aggregates run there).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import func, select  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from app.config import load_settings, normalise_database_url  # noqa: E402
from app.db import Database  # noqa: E402
from app.lifecycle import stats  # noqa: E402
from app.migrate import upgrade  # noqa: E402
from app.models import DeadLetter, Delivery, InboundEvent  # noqa: E402
from app.runtime import Runtime  # noqa: E402
from app.services import attempt_totals, metrics  # noqa: E402


def counted(session: Session) -> object:
    """The exact figures, every table read whole (what a render did before)."""
    figures = [
        dict(session.execute(select(column, func.count()).group_by(column)).all())
        for column in (Delivery.state, DeadLetter.state, InboundEvent.status)
    ]
    return figures, attempt_totals.count(session)


def timed(run: Callable[[], object]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    url = normalise_database_url(os.environ["BENCH_DATABASE_URL"])
    upgrade(url)
    settings = load_settings({**os.environ, "DATABASE_URL": url})
    runtime = Runtime(settings, database=Database(url, pool_size=2))
    with runtime.db.begin() as session:
        sizes = {s.table: s.rows for s in stats.tables(session)}
    print(
        "rows (estimated): "
        + ", ".join(f"{t} {sizes.get(t, 0):,}" for t in ("deliveries", "attempts", "events"))
    )
    wall, cpu = timed(lambda: attempt_totals.fold(runtime))
    print(f"first fold of the attempt totals: {wall:.1f} s wall, {cpu:.2f} s CPU")
    wall, cpu = timed(lambda: attempt_totals.fold(runtime))
    print(f"a fold with nothing new: {wall * 1000:.1f} ms wall, {cpu * 1000:.1f} ms CPU")

    def render(session: Session) -> object:
        return metrics.database(session, settings)

    ways: dict[str, Callable[[Session], object]] = {"counted": counted, "render": render}
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
    for _ in range(args.repeat):
        for name, run in ways.items():
            with runtime.db.begin() as session:
                samples[name].append(timed(partial(run, session)))
    for name, found in samples.items():
        walls = [w * 1000 for w, _ in found]
        cpus = [c * 1000 for _, c in found]
        print(
            f"{name:8} p50 {statistics.median(walls):9.1f} ms, max {max(walls):9.1f} ms wall; "
            f"{statistics.mean(cpus):6.1f} ms CPU here per render ({len(found)} renders)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
