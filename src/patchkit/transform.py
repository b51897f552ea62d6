"""The authoring API of transform patches: ``from patchkit.transform import Transform``.

The transform kind (``patchkit.kinds.transform``) owns it; this module keeps the name patch
authors import stable.
"""

from patchkit.kinds.transform import (  # noqa: F401
    AmbiguousAnchorError,
    AnchorError,
    AnchorMissingError,
    CxxTransform,
    Span,
    Transform,
    TransformLoadError,
    load_transforms,
    run_transform_file,
    sibling,
)

__all__ = ["AmbiguousAnchorError", "AnchorError", "AnchorMissingError", "CxxTransform", "Span",
           "Transform",
           "TransformLoadError", "load_transforms", "run_transform_file", "sibling"]
