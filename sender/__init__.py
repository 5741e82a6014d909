"""Outbound delivery building blocks kept free of web-framework and database concerns."""
