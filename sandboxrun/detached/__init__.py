"""Detached sandboxes: a sandbox that outlives the call that made it (a peer of ``api``).

``sandboxrun create`` starts a *keeper* (``sandboxrun.cli.keeper``, a program as the CLI is),
a small daemon of the caller's uid that holds one open ``Sandbox`` and serves it on a unix
socket in a private runtime directory (``place``); ``sandboxrun exec NAME``, ``ls`` and ``rm``
(and ``Sandbox.attach``) are its clients (``client``, ``handle``), speaking JSON lines
(``protocol``). The keeper owns the sandbox as any program would: if it dies, the backend's
owner-death cleanup removes the sandbox with every process. ``client`` imports only the
standard library and ``errors``: a CLI ``exec`` costs milliseconds.
"""
