"""Kept for the documented path: ``sandboxrun.blocking`` is ``sandboxrun.integrations.blocking``."""

from sandboxrun.integrations.blocking import BlockingJob, BlockingSandbox

__all__ = ["BlockingJob", "BlockingSandbox"]
