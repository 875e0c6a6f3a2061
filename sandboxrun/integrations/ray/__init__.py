"""Sandboxes across a Ray cluster (``sandboxrun.ray``; the extra ``sandboxrun[ray]``)."""
