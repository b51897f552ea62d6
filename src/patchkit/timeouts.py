"""How long patchkit waits on a silent peer: an engine, a node over ssh, a registry, a server.

One default for every such wait, which ``--timeout SECONDS`` changes.  For engines and nodes it
bounds each silence (the connection, then every wait for the next bytes), never a whole
transfer: a load, export or push of gigabytes goes on as long as bytes keep coming.  The small
HTTP calls of ``http`` (smoke, GitHub) and skopeo's registry queries are bounded as a whole.
Another patchkit run holding a lock is no silent peer: ``filelocks.WAIT`` bounds that wait.
"""

from __future__ import annotations

DEFAULT_TIMEOUT = 30.0


def shown(seconds: float) -> str:
    """``2 s``, ``0.5 s``: a timeout as messages say it."""
    return f"{seconds:g} s"
