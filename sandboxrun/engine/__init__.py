"""Backend-neutral: the request, the argv/env/path builders, output capture, supervision of one
run and the results. Imports only ``supervisor`` and the public leaves (``errors``, ``models``,
``units``)."""
