"""The systemd-scope backend: the backend, its unit/launcher configuration, the scope helpers."""
