"""Who is acting: the one value every service takes to decide, and to write in the audit.

Each face turns its own credential into an Actor: the API a bearer key (`key:<name>`), the
operator UI a signed-in operator (`operator:<email>`), the command line the shell user
(`cli`), the partner portal a magic-link session (`portal:<uid>`); Kurir's own jobs act as
`system`. Services ask the actor, never the face, what it may do.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from app.errors import Forbidden, NotFound
from app.models import SCOPES

KEY, OPERATOR, CLI, PORTAL, SYSTEM = "key", "operator", "cli", "portal", "system"
# What a partner is shown instead of the name of an operator, an admin key or the CLI.
PUBLISHER = "publisher"
ALL_SCOPES = frozenset(SCOPES)
# Scopes a partner-scoped credential can hold: it can never publish, nor manage contracts,
# sources, operators or keys.
PARTNER_SCOPES = frozenset({"read", "endpoints:write", "dlq:write", "feed:write"})


def shown_to(reader_partner_id: str | None, name: str, actor_partner_id: str | None) -> str:
    """The name of whoever did something, as a reader is shown it.

    Operators' e-mails and admin keys' names are the publisher's own business: a reader
    bound to a partner (its key, its portal) sees its own credentials and Kurir's jobs
    (`system`) by name, and every other actor as "publisher". `actor_partner_id` is the
    partner the actor was bound to when it acted (recorded with the row, never guessed from
    a name: key names are not unique). Everything that shows a partner an actor's name —
    audit rows, dead-letter audit rows, the link a portal session came through, a test
    event's `sent_by` — asks here.
    """
    if (
        reader_partner_id is None
        or name == SYSTEM
        or (actor_partner_id is not None and actor_partner_id == reader_partner_id)
    ):
        return name
    return PUBLISHER


def scope_allows(granted: Iterable[str], needed: str) -> bool:
    """`admin` grants everything; any write scope also grants `read`."""
    granted = set(granted)
    if "admin" in granted or needed in granted:
        return True
    return needed == "read" and any(s.endswith(":write") for s in granted)


@dataclass(frozen=True)
class Actor:
    """An authenticated caller: what it is, what it may do, and which partner it is bound to."""

    kind: str
    name: str = ""
    scopes: frozenset[str] = field(default=ALL_SCOPES)
    key_id: str | None = None
    # Set for partner-bound callers (partner keys, the portal): they reach only this partner.
    partner_id: str | None = None
    partner_uid: str | None = None
    # The portal session acting (audited with each of its changes).
    session_id: str | None = None

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}" if self.name else self.kind

    # ------------------------------------------------------------------ construction

    @classmethod
    def key(
        cls,
        name: str,
        scopes: Iterable[str],
        key_id: str,
        *,
        partner_id: str | None = None,
        partner_uid: str | None = None,
    ) -> Actor:
        return cls(KEY, name, frozenset(scopes), key_id, partner_id, partner_uid)

    @classmethod
    def operator(cls, email: str) -> Actor:
        return cls(OPERATOR, email)

    @classmethod
    def cli(cls, user: str | None = None) -> Actor:
        return cls(CLI, user or "")

    @classmethod
    def portal(
        cls,
        partner_id: str,
        partner_uid: str,
        session_id: str | None = None,
        *,
        read_only: bool = False,
    ) -> Actor:
        """A portal session; a read-only one holds `read` alone, so every service refuses
        its changes whatever the page."""
        scopes = frozenset({"read"}) if read_only else PARTNER_SCOPES
        return cls(PORTAL, partner_uid, scopes, None, partner_id, partner_uid, session_id)

    @classmethod
    def system(cls) -> Actor:
        return cls(SYSTEM)

    # ------------------------------------------------------------------ decisions

    def allows(self, scope: str) -> bool:
        if self.partner_id is not None and scope not in PARTNER_SCOPES and scope != "read":
            return False
        return scope_allows(self.scopes, scope)

    def require(self, scope: str) -> None:
        """Raises Forbidden (403) when the actor lacks `scope`."""
        if self.partner_id is not None and scope not in PARTNER_SCOPES:
            # What a partner credential can never do does not exist for it.
            raise NotFound("not found")
        if not self.allows(scope):
            raise Forbidden(
                f"this caller lacks the scope {scope!r}",
                details={"required_scope": scope, "granted": sorted(self.scopes)},
            )

    def shows(self, name: str, actor_partner_id: str | None) -> str:
        """How this reader is shown the actor `name` (see `shown_to`)."""
        return shown_to(self.partner_id, name, actor_partner_id)

    def may_see_partner(self, partner_id: str) -> bool:
        return self.partner_id is None or self.partner_id == partner_id

    @property
    def bound_to_partner(self) -> bool:
        return self.partner_id is not None
