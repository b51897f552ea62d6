"""How long patchkit waits on a silent peer: an engine, a node over ssh, a registry, a server.

One default for every such wait, which ``--timeout SECONDS`` changes.  For engines and nodes it
bounds each silence (the connection, then every wait for the next bytes), never a whole
transfer: a load, export or push of gigabytes goes on as long as bytes keep coming.  The small
HTTP calls of ``http`` (smoke, GitHub) and skopeo's registry queries are bounded as a whole.
Another patchkit run holding a lock is no silent peer: ``filelocks.WAIT`` bounds that wait.

Git has deadlines of its own, each bounding a whole command: a command on this machine, and the
clone or fetch of a mirror, which moves a project's whole history.  A query or push to a user's
remote (``bump --push``) is bounded by the timeout its caller gives.
"""

from __future__ import annotations

DEFAULT_TIMEOUT = 30.0
# A git command on this machine (a checkout of a large tree, a commit of an image's files, a
# bundle) ends well within this; one that does not is stuck (a hung disk, a lock git waits on).
GIT_LOCAL = 600.0
# A mirror's clone or fetch may take long on a slow link; git's own low-speed limit ends it
# sooner when the link goes quiet, and this bounds the whole transfer.
GIT_TRANSFER = 3600.0


def shown(seconds: float) -> str:
    """``2 s``, ``0.5 s``: a timeout as messages say it."""
    return f"{seconds:g} s"
