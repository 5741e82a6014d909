"""Sending: everything between a committed delivery row and its recorded outcome.

The engine claims due deliveries, admits them past each endpoint's rate and ordering gates,
sends them over pinned connections (`app.net`), signs them, records each attempt, schedules
retries, watches endpoint health, sweeps what a worker lost, and parks what it gave up on
(`park`, the one way a delivery becomes a dead letter). It does not create partners,
endpoints or events: those come from `app.registry` and `app.intake`.
"""
