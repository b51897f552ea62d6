"""patchset.yaml: the model (frozen dataclasses), the line-keeping loader, and text edits.

``load`` is the one way in; nothing past it handles raw dicts.
"""

from patchkit.manifest.loader import KINDS, load
from patchkit.manifest.model import (
    ID_MAX,
    ID_RE,
    PREDICATES,
    Assertion,
    BumpSettings,
    ImageDefaults,
    Manifest,
    Marker,
    Package,
    Patch,
    Retired,
    VLLM,
    VllmSource,
    capped_id,
    id_problem,
    identity,
    shown_id,
    summary_problem,
)

__all__ = ["ID_MAX", "ID_RE", "KINDS", "PREDICATES", "VLLM", "Assertion", "BumpSettings", "ImageDefaults",
           "Manifest", "Marker", "Package", "Patch", "Retired", "VllmSource", "capped_id", "id_problem",
           "identity",            "load", "shown_id", "summary_problem"]
