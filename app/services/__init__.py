"""The services: what any actor can do to Kurir's resources, decided and audited once.

Every face — the REST API (`app.web.api`), the operator UI (`app.web.ui`), the partner portal
(`app.web.portal`) and the command line (`app.cli`) — parses its input, opens the
transaction, calls one service function with an `Actor`, and renders the answer. The services

- check what the actor may do (its scopes; for a partner-bound actor, its partner only, every
  other partner's resources answering `404 not_found`),
- validate through the pipelines' rules (`app.registry`, `app.intake`, `app.feed`, `sender`,
  `dlq`, `app.inbound`),
- write the audit row (`app.services.audit`) in the caller's transaction,

and never import Flask or click, never commit. One module per thing an actor acts on:

    actor          who is acting, and what it may do
    audit          the audit trail
    partners       partners, and which of them an actor may see; a partner's opt-ins
    operational    the operator endpoints that receive operational events
    endpoints      endpoints: create, change, enable/disable, secrets
    event_types    contracts (event types and versions)
    events         publishing, and reading events back
    deliveries     one delivery, and "try it now"
    dead_letters   search, resend, discard
    keys           API keys, and authentication of a bearer token
    operators      UI accounts and their sessions
    portal         magic links into the partner portal and the sessions they open
    pins           an endpoint's version pins with their deprecation and sunset
    feed           reading a partner's feed, acknowledging, pull endpoints' lag
    dashboard      the operator dashboard's figures (read-only)
    metrics        the figures /metrics shows (read-only, no actor: the scrape token decides)
    sources        inbound sources, received callbacks, replay, the receiving door
    secret_keys    re-encryption under a new master key
"""
