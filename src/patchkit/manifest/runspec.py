"""The run value moved to :mod:`patchkit.run`; this name stays only for ``commands/bump.py``
until it imports the run from there.  Nothing else imports it."""

from patchkit.run import Pin, RunSpec, run_spec  # noqa: F401

__all__ = ["Pin", "RunSpec", "run_spec"]
