"""How many PostgreSQL and Redis connections each kind of Kurir process opens, at most.

Every process builds its pools from this table, so the numbers here are the ones the servers
see: a SQLAlchemy pool of exactly `postgres` connections with no overflow (one more waits
`KURIR_DB_POOL_TIMEOUT_S`, then fails with `app.db.PoolExhausted`), and Redis clients capped
the same way. Each connection carries its kind's name (`application_name` on PostgreSQL,
`CLIENT SETNAME` on Redis), so `pg_stat_activity` and `CLIENT LIST` can count them, and
`kurir doctor` adds a fleet up against the servers' limits.

Per kind, per OS process:

- **api** (each of `kurir api`'s `KURIR_API_WORKERS` server processes): one connection per
  request thread, plus `API_SPARE` (a request that reads its UI session in a second
  transaction, a probe). Redis: the same.
- **worker**: the threads that touch the database are fixed, not one per sending thread (the
  lanes only send; one writer records): the delivery consumer's claims, the writer, the timer
  thread, the inbound consumer, RQ's job thread, and one spare for a nested transaction.
  Redis: the delivery and inbound consumers' blocking reads (one each), RQ's worker and its
  command listener (two), the engine's fail-fast side channel (`WORKER_SIDE_CHANNEL`) and the
  shared client (`WORKER_REDIS_POOL`: enqueues after commit, jobs).
- **scheduler**: `KURIR_SCHEDULER_THREADS` job threads and the lease keeper. Redis: one per
  job thread.
- **cli**: a command, `kurir doctor` or a migration: `CLI_CONNECTIONS` of each.
- **embedded**: a Runtime built without a kind (tests, benches, anything that runs api,
  worker and scheduler in one process): the ceiling such a process always had.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from app.config import Settings

API_SPARE = 2
WORKER_POSTGRES = 6
WORKER_REDIS_POOL = 4
WORKER_SIDE_CHANNEL = 4
WORKER_REDIS_OWN = 4  # delivery consumer, inbound consumer, RQ's worker and its listener
CLI_CONNECTIONS = 2
SCHEDULER_KEEPER = 1


class ProcessKind(StrEnum):
    API = "api"
    WORKER = "worker"
    SCHEDULER = "scheduler"
    CLI = "cli"
    EMBEDDED = "embedded"


# The kinds a fleet is made of, in the order `kurir doctor` prints them.
FLEET_KINDS: tuple[ProcessKind, ...] = (
    ProcessKind.API,
    ProcessKind.WORKER,
    ProcessKind.SCHEDULER,
    ProcessKind.CLI,
)


def application_name(kind: ProcessKind) -> str:
    """What a process of `kind` calls itself to PostgreSQL and Redis."""
    return f"kurir-{kind.value}"


@dataclass(frozen=True)
class Budget:
    """One command's connections: `postgres` and `redis` per OS process, `processes` of them
    (`kurir api` runs `KURIR_API_WORKERS` server processes; the rest run one)."""

    kind: ProcessKind
    postgres: int
    redis: int
    redis_pool: int  # of `redis`, the process's shared client (Runtime.redis)
    processes: int = 1

    @property
    def postgres_total(self) -> int:
        return self.postgres * self.processes

    @property
    def redis_total(self) -> int:
        return self.redis * self.processes


def budget_for(settings: Settings, kind: ProcessKind) -> Budget:
    """The budget of one process of `kind` under `settings`."""
    if kind is ProcessKind.API:
        per_process = settings.api_threads + API_SPARE
        return Budget(kind, per_process, per_process, per_process, settings.api_workers)
    if kind is ProcessKind.WORKER:
        redis = WORKER_REDIS_POOL + WORKER_SIDE_CHANNEL + WORKER_REDIS_OWN
        return Budget(kind, WORKER_POSTGRES, redis, WORKER_REDIS_POOL)
    if kind is ProcessKind.SCHEDULER:
        threads = settings.scheduler_threads
        return Budget(kind, threads + SCHEDULER_KEEPER, threads, threads)
    if kind is ProcessKind.CLI:
        return Budget(kind, CLI_CONNECTIONS, CLI_CONNECTIONS, CLI_CONNECTIONS)
    # Everything in one process, sharing one pool: what it had before budgets (a pool of
    # max(10, threads + 2) with twice that in overflow), now as a hard cap.
    ceiling = 3 * max(10, settings.worker_threads + 2)
    redis = ceiling + WORKER_SIDE_CHANNEL + WORKER_REDIS_OWN
    return Budget(kind, ceiling, redis, ceiling)


def budgets(settings: Settings) -> dict[ProcessKind, Budget]:
    """The fleet's kinds and their budgets."""
    return {kind: budget_for(settings, kind) for kind in FLEET_KINDS}


@dataclass(frozen=True)
class FleetLine:
    budget: Budget
    count: int  # commands of this kind (`kurir api` counts once, whatever its server processes)

    @property
    def postgres(self) -> int:
        return self.budget.postgres_total * self.count

    @property
    def redis(self) -> int:
        return self.budget.redis_total * self.count


@dataclass(frozen=True)
class Fleet:
    lines: tuple[FleetLine, ...]

    @property
    def postgres(self) -> int:
        return sum(line.postgres for line in self.lines)

    @property
    def redis(self) -> int:
        return sum(line.redis for line in self.lines)


def fleet(settings: Settings, counts: dict[ProcessKind, int]) -> Fleet:
    """`counts[kind]` commands of each kind (missing: none) under the same settings."""
    table = budgets(settings)
    return Fleet(tuple(FleetLine(table[kind], counts.get(kind, 0)) for kind in FLEET_KINDS))


def postgres_room(max_connections: int, reserved: int) -> int:
    """The connections PostgreSQL gives a role that is not a superuser."""
    return max(0, max_connections - reserved)
