"""``patchkit copy-image IMAGE --to ENGINE...``: the same image content on other engines (the
copy itself is :mod:`patchkit.nodes.transfer`'s)."""

from __future__ import annotations

import re
from typing import Callable, Sequence

from patchkit.errors import Origin, UsageError
from patchkit.engines.docker import Engine
from patchkit.nodes.transfer import CopyReport, How, Log, check_compress, check_targets, \
    check_via, copy, dialed
from patchkit.imageref import check_reference
from patchkit.manifest import Manifest
from patchkit.run import built_tag
from patchkit.timeouts import DEFAULT_TIMEOUT


def built_image(manifest: Manifest) -> str:
    """The tag build-image gives the manifest's default build at its pin (image.tag, else
    NAME:{ref})."""
    return built_tag(manifest)


def run(image: str, targets: Sequence[str], *, source: Engine | None = None,
        connect: Callable[[str], Engine] | None = None, log: Log = lambda m: None,
        timeout: float = DEFAULT_TIMEOUT, how: How = How()) -> CopyReport:
    """Copy ``image`` from ``source`` (default: the engine DOCKER_HOST names) to each target,
    through the registry ``how.via`` when given; ``timeout`` bounds each silence of an
    engine."""
    via = check_via(how.via) if how.via is not None else None
    if via and (how.dry_run or how.compress != "none"):
        raise UsageError(f"--via {via} goes without "
                         f"{'--dry-run' if how.dry_run else '--compress'}: through a registry "
                         "the engines choose what to send, compressed")
    if re.fullmatch(r"(sha256:)?[0-9a-f]{12,64}", image):
        raise UsageError(f"IMAGE {image!r} is an image id; copy-image takes a tag, which the "
                         "targets then hold")
    check_reference(Origin("IMAGE"), image, digest_ok=False)
    urls = check_targets(targets)
    if not urls:
        raise UsageError("give the engines to copy to with --to ENGINE")
    check_compress(how.compress)
    with dialed(urls, timeout, connect) as reach:   # ssh connects while the source answers
        source = source or Engine.connect(timeout=timeout)
        return copy(source, image, urls, connect=reach, log=log, timeout=timeout, via=via,
                    dry_run=how.dry_run, compress=how.compress)
