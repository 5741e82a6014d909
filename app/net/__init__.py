"""Outbound network core shared by every pipeline that calls a partner-supplied URL.

`guard` decides which addresses may be reached (the SSRF rules); `http` is the pinned,
deadline-bounded transport that connects only to the address the guard approved. Delivery
(`sender`) and inbound reconciliation (`app.inbound.reconcile`) both use them; nothing here
knows about deliveries, partners or the database.
"""
