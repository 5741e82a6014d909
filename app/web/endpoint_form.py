"""The endpoint form, shared by the partner portal (create, edit) and the operator UI (edit).

It turns the HTML form into the body the endpoints service takes — the same body as the API's
POST and PATCH, so every rule (the SSRF guard, reserved headers, known event types) is the
service's, and its error comes back on the field it names.

Custom header values are write-only: a stored value is never put back into the page unless
its header is public. An edit leaves the value box of a write-only header empty; sent empty,
it keeps the stored value (the service's `null`), typed into, it replaces it.

Version pins: one selector per event type, "as published" or one of its versions, so a
partner stays on the shape its code reads until it is ready for the next (a pin to a
deprecated version shows its sunset). The form sends the whole `versions` object; the
service checks every pin exists.

The signature kind (HMAC or Ed25519) is chosen when the endpoint is created; it changes later
only by a rotation (the secret page), never by this form.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app import headers as header_rules
from app.errors import KurirError
from app.models import Endpoint
from app.vocabulary import EndpointMode, OnDead, Ordering, SignatureKind

EXTRA_HEADER_ROWS = 2
PIN_FIELD = "pin-"  # a selector per event type: pin-<type name> = "" (as published) or "<n>"
MAX_HEADER_ROWS = 25


@dataclass
class HeaderRow:
    name: str = ""
    value: str = ""
    public: bool = False
    stored: bool = False  # a header the endpoint has: an empty value keeps what is stored
    remove: bool = False

    @property
    def hidden(self) -> bool:
        """A stored write-only value: the page shows that one is set, never what it is."""
        return self.stored and not self.public


@dataclass
class EndpointForm:
    url: str = ""
    description: str = ""
    all_types: bool = True
    event_types: list[str] = field(default_factory=list)
    headers: list[HeaderRow] = field(default_factory=list)
    timeout_s: str = ""
    rate_limit_per_s: str = ""
    versions: dict[str, str] = field(default_factory=dict)  # event type -> "" or "<n>"
    # A pull endpoint has no URL: nothing is pushed, its consumer reads the feed. Chosen when
    # the endpoint is created (`creating`), fixed afterwards.
    pull: bool = False
    creating: bool = False
    ordering: str = "none"
    on_dead: str = "skip"
    # Re-enabled by the first 2xx to a probe after Kurir disabled it for failures.
    auto_recover: bool = True
    signature: str = SignatureKind.HMAC.value  # sent only when creating
    # Ask for the ownership challenge (sent only when creating, and only when ticked: unticked
    # leaves the publisher's default, `KURIR_VERIFY_ENDPOINTS`).
    verify: bool = False
    # A JMESPath filter over the event ("" for none), and what trying it showed.
    filter: str = ""
    tried: Any = None
    errors: dict[str, str] = field(default_factory=dict)

    @classmethod
    def blank(cls, default_timeout_s: int) -> EndpointForm:
        form = cls(timeout_s=str(default_timeout_s), creating=True)
        form.headers = [HeaderRow() for _ in range(EXTRA_HEADER_ROWS)]
        return form

    @classmethod
    def from_endpoint(cls, endpoint: Endpoint) -> EndpointForm:
        shown = header_rules.redact_custom(endpoint.headers or {}, endpoint.public_headers)
        rows = [
            HeaderRow(name, value or "", public=value is not None, stored=True)
            for name, value in shown.items()
        ]
        rows += [HeaderRow() for _ in range(EXTRA_HEADER_ROWS)]
        return cls(
            url=header_rules.redact_url(endpoint.url) or "",
            description=endpoint.description or "",
            all_types=endpoint.event_types is None,
            event_types=list(endpoint.event_types or []),
            headers=rows,
            timeout_s=str(endpoint.timeout_s),
            rate_limit_per_s=""
            if endpoint.rate_limit_per_s is None
            else str(endpoint.rate_limit_per_s),
            versions={name: str(version) for name, version in (endpoint.versions or {}).items()},
            pull=endpoint.mode == EndpointMode.PULL,
            ordering=endpoint.ordering or Ordering.NONE.value,
            on_dead=endpoint.on_dead or OnDead.SKIP.value,
            auto_recover=endpoint.auto_recover is not False,
            signature=endpoint.signature or SignatureKind.HMAC.value,
            filter=endpoint.filter or "",
        )

    @classmethod
    def from_request(cls, form: Any, existing: Endpoint | None = None) -> EndpointForm:
        """The form as posted (a werkzeug MultiDict)."""
        stored = {n.lower() for n in (existing.headers or {})} if existing is not None else set()
        rows: list[HeaderRow] = []
        for i in range(MAX_HEADER_ROWS):
            if f"header-{i}-name" not in form:
                continue
            name = form.get(f"header-{i}-name", "").strip()
            rows.append(
                HeaderRow(
                    name=name,
                    value=form.get(f"header-{i}-value", ""),
                    public=form.get(f"header-{i}-public") == "1",
                    stored=name.lower() in stored and form.get(f"header-{i}-stored") == "1",
                    remove=form.get(f"header-{i}-remove") == "1",
                )
            )
        if not any(not r.name for r in rows):
            rows.append(HeaderRow())
        return cls(
            url=form.get("url", "").strip(),
            description=form.get("description", "").strip(),
            all_types=form.get("all_types", "1") == "1",
            event_types=[t for t in form.getlist("event_types") if t],
            headers=rows,
            timeout_s=form.get("timeout_s", "").strip(),
            rate_limit_per_s=form.get("rate_limit_per_s", "").strip(),
            versions={
                key[len(PIN_FIELD) :]: value.strip()
                for key, value in form.items()
                if key.startswith(PIN_FIELD) and value.strip()
            },
            pull=(
                existing.mode == EndpointMode.PULL
                if existing is not None
                else form.get("mode") == EndpointMode.PULL
            ),
            creating=existing is None,
            ordering=form.get("ordering", Ordering.NONE.value),
            on_dead=form.get("on_dead", OnDead.SKIP.value),
            # An unticked box sends nothing: the form's marker says the box was shown.
            auto_recover=(
                form.get("auto_recover") == "1" if "auto_recover-shown" in form else True
            ),
            signature=(
                existing.signature or SignatureKind.HMAC.value
                if existing is not None
                else form.get("signature", SignatureKind.HMAC.value)
            ),
            verify=existing is None and form.get("verify") == "1",
            filter=form.get("filter", "").strip(),
        )

    # ------------------------------------------------------------------ to the service

    def _int(self, name: str, raw: str, *, optional: bool) -> int | None:
        if not raw:
            if optional:
                return None
            self.errors[name] = "required"
            return None
        if not raw.isdigit():
            self.errors[name] = "must be a whole number"
            return None
        return int(raw)

    def body(self, *, editing: bool) -> dict[str, Any] | None:
        """The service body, or None with `errors` set for what the form itself can tell."""
        self.errors = {}
        headers: dict[str, str | None] = {}
        public: list[str] = []
        for row in self.headers:
            if row.remove or (not row.name and not row.value):
                continue
            if not row.name:
                self.errors["headers"] = "a header value was given without a name"
                continue
            if row.value:
                headers[row.name] = row.value
            elif row.stored and editing:
                headers[row.name] = None  # keep the stored value
            else:
                self.errors["headers"] = f"header {row.name!r} needs a value"
                continue
            if row.public:
                public.append(row.name)
        body: dict[str, Any] = {
            "url": self.url,
            "description": self.description or None,
            "event_types": None if self.all_types else self.event_types,
            "headers": headers,
            "public_headers": public,
            "timeout_s": self._int("timeout_s", self.timeout_s, optional=False),
            "rate_limit_per_s": self._int("rate_limit_per_s", self.rate_limit_per_s, optional=True),
            "ordering": self.ordering,
            "on_dead": self.on_dead,
            "filter": self.filter or None,
        }
        pins: dict[str, int] = {}
        for name, raw in self.versions.items():
            if raw.isdigit() and int(raw) > 0:
                pins[name] = int(raw)
            else:
                self.errors["versions"] = f"the version for {name} must be a version number"
        body["versions"] = pins
        if not self.all_types and not self.event_types:
            self.errors["event_types"] = (
                "choose at least one event type, or receive all event types"
            )
        if self.creating and not self.pull:
            body["signature"] = self.signature
            if self.verify:
                body["verify"] = True
        if not self.pull:
            body["auto_recover"] = self.auto_recover
        if self.pull:
            del body["url"]
            if self.creating:
                body["mode"] = EndpointMode.PULL.value
        elif not self.url:
            self.errors["url"] = "required"
        return None if self.errors else body

    def filter_test_body(self) -> dict[str, Any]:
        """What trying the form's filter asks the filters service (its own text, even
        empty, so an empty box is refused rather than the stored filter tried)."""
        return {"filter": self.filter or None}

    @property
    def tried_types(self) -> list[str] | None:
        """The event types a filter is tried on from this form (None: every type)."""
        return None if self.all_types else self.event_types

    def refused(self, exc: KurirError) -> None:
        """Put the service's refusal on the field it names (or on the whole form)."""
        details: Mapping[str, Any] = exc.details if isinstance(exc.details, Mapping) else {}
        name = details.get("field")
        if "header" in details or name == "public_headers":
            name = "headers"
        self.errors[str(name) if name else "form"] = exc.message
