"""The inspect_ai sandbox provider. Empty on purpose: importing ``config`` (the documented
``SandboxrunConfig``) must not import inspect_ai through ``registry``."""
