"""``patchkit apply``: the pinned checkout, the series, the assertions, into the workdir."""

from __future__ import annotations

from contextlib import ExitStack

from patchkit.image import basevllm
from patchkit.engines.docker import Engine
from patchkit.manifest import Manifest
from patchkit.report import ApplyReport
from patchkit.run import Asked
from patchkit.series import applier


def run(manifest: Manifest, asked: Asked, *, keep_failed: bool = False,
        progress: applier.Progress | None = None, discard: bool = False) -> ApplyReport:
    """The run made of ``asked`` applied into its workdir.  Its base (the option, else
    image.base) is the image the ref ``base`` and the source ``image`` read; an engine is
    connected only when they are used.  ``discard``: replace a workdir holding a person's work
    (saved in a bundle beside it)."""
    progress = progress or applier.Progress()
    wants = asked.engine is None and asked.reads_base(manifest)
    spec = asked.spec(manifest, Engine.connect(timeout=asked.timeout) if wants else None)
    for place in applier.workdirs(spec, spec.workdir).values():
        applier.check_workdir(place, discard)  # before any source is asked
    with ExitStack() as hold:   # the base, read once, open for the apply
        held = basevllm.held(spec, hold, log=progress.info)
        holder = basevllm.for_run(spec, held, log=progress.info)
        bases = basevllm.for_packages(spec, held, log=progress.info)
        return applier.apply_series(manifest, run=spec, workdir=spec.workdir,
                                    keep_failed=keep_failed, progress=progress, base=holder,
                                    discard=discard, bases=bases)
