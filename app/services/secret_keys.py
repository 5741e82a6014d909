"""The master key that encrypts signing secrets at rest: move every secret to the newest key.

After KURIR_SECRET_KEY gains a new first key (`new,old`), every process decrypts with either;
re-encrypting moves all stored secrets under the new one, after which the old key can go.
Secrets made with the first passphrase derivation move to the current one the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.models import EndpointSecret, InboundSourceSecret
from app.runtime import Runtime
from app.services import audit
from app.services.actor import Actor

PAGE_SIZE = 500
TABLES: tuple[type[EndpointSecret] | type[InboundSourceSecret], ...] = (
    EndpointSecret,
    InboundSourceSecret,
)


@dataclass
class Progress:
    seen: int = 0
    reencrypted: int = 0
    unreadable: int = 0


def reencrypt_page(
    session: Session,
    rt: Runtime,
    actor: Actor,
    table: type[EndpointSecret] | type[InboundSourceSecret],
    after: str | None,
    progress: Progress,
) -> str | None:
    """Re-encrypt up to PAGE_SIZE rows of `table` after id `after`; returns the last id seen
    (None when the table is done). Rows no configured key can read are counted, left as they
    are."""
    actor.require("admin")
    stmt = select(table).order_by(table.id).limit(PAGE_SIZE)
    if after is not None:
        stmt = stmt.where(table.id > after)
    rows: list[EndpointSecret | InboundSourceSecret] = list(session.scalars(stmt))
    box = rt.secret_box
    for row in rows:
        progress.seen += 1
        if box.is_current(row.secret_encrypted):
            continue
        try:
            row.secret_encrypted = box.reencrypt(row.secret_encrypted)
        except ValueError:
            progress.unreadable += 1
            continue
        progress.reencrypted += 1
    session.flush()
    return rows[-1].id if rows else None


def record(session: Session, actor: Actor, progress: Progress) -> None:
    audit.record(
        session,
        actor,
        "secrets.reencrypted",
        "secret_key",
        "newest",
        seen=progress.seen,
        reencrypted=progress.reencrypted,
        unreadable=progress.unreadable,
    )
