"""Variants: named builds of one series (``variants:`` at the top, a patch's ``variants:``).

A build without a variant has the patches that name no variant; a build of variant V adds the
patches that name V.  A patch left out of a build is ``skipped``, with the reason.  ``EVERY``
selects every patch whatever its variants: what ``rebase`` works on, since it refreshes every
patch file of the series.
"""

from __future__ import annotations

import difflib
import re

from patchkit.errors import Origin, SettingError, literal
from patchkit.manifest.model import Manifest, Patch

VARIANT = Origin("variant")


class _Every:
    def __repr__(self) -> str:
        return "EVERY"


EVERY = _Every()  # no selection: every patch of the series

PLACEHOLDER = "{variant}"


def check(manifest: Manifest, name: str | None) -> str | None:
    """``name`` when the manifest declares it (None stays None); else a one-line error naming
    the variant setting."""
    if name is None:
        return None
    if name in manifest.variants:
        return name
    declared = list(manifest.variants)
    if not declared:
        raise SettingError(f"{{variant}} {literal(repr(name))}: {literal(manifest.path.name)} "
                           "declares no variants", VARIANT)
    close = difflib.get_close_matches(name, declared, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else f" (declared: {', '.join(declared)})"
    raise SettingError(f"{{variant}} {literal(repr(name))}: unknown variant{literal(hint)}",
                       VARIANT)


def left_out(patch: Patch, variant) -> str | None:
    """Why ``patch`` is not in the build of ``variant`` (a name, None or EVERY), or None."""
    if variant is EVERY or not patch.variants or variant in patch.variants:
        return None
    names = ", ".join(patch.variants)
    return f"only in variant{'s' if len(patch.variants) > 1 else ''} {names}"


def selected(manifest: Manifest, variant) -> list[Patch]:
    return [p for p in manifest.patches if left_out(p, variant) is None]


def fill_tag(template: str, variant: str | None) -> str:
    """``{variant}`` in an image tag: the variant's name; without a variant it goes, with one
    separator (``-``, ``_`` or ``.``) before it or else after it, so ``demo:{ref}-{variant}``
    gives ``demo:v1-diag`` and ``demo:v1``."""
    if variant:
        return template.replace(PLACEHOLDER, variant)
    text = re.sub(r"[-_.]\{variant\}", "", template)
    text = re.sub(r"\{variant\}[-_.]", "", text)
    return text.replace(PLACEHOLDER, "")


def default_tag(manifest: Manifest, ref: str | None, version: str | None, template: str,
                variant: str | None = None) -> str:
    """The image tag a build of ``manifest`` at ``ref`` gets: the run's tag ``template`` with
    ``{ref}``, ``{version}``, ``{name}`` and ``{variant}`` filled in."""
    # a branch ref such as release/0.27 holds characters no image tag may
    ref_part = re.sub(r"[^\w.-]", "-", str(ref or "latest"))
    version_part = re.sub(r"[^\w.-]", "-", str(version or ref_part))
    text = fill_tag(template, variant)
    text = text.replace("{ref}", ref_part).replace("{version}", version_part)
    return text.replace("{name}", manifest.name)


def describe(variant: str | None) -> str:
    return f"variant {variant}" if variant else "the default build (no variant)"
