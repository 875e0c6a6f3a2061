"""The docker backend: the backend, the SDK boundary (``api``), the pure builders (``config``,
``seccomp``), the engine exec path, the supervisor rendezvous, the cgroup reader."""
