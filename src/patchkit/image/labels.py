"""The labels patchkit puts on an image: written here, and read back here alone.

``run_labels`` says what was applied (the patchset, the vLLM release, every patch's status);
``base_labels`` the base an overlay was laid on; ``overlay_labels`` what the overlay layer
holds and the inputs key that finds the image again.  :class:`ImageFacts` is the one reader.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone

from patchkit import __version__, source, versions
from patchkit.formats import layer
from patchkit.git import Provenance
from patchkit.image.prebuilt import CUBIN_ENV, WORKSPACE_ENV
from patchkit.imageref import split_tag
from patchkit.manifest import Manifest
from patchkit.report import Status
from patchkit.series.checkout import AppliedCheckout

INPUTS_LABEL = "io.patchkit.inputs"
PATCHSET_LABEL = "io.patchkit.patchset.name"
VLLM_VERSION_LABEL = "io.patchkit.vllm.version"
SUFFIX_HEX = 12   # the hex digits of a build's immutable tag
VARIANT_LABEL = "io.patchkit.variant"  # the variant built; empty for the default build
PATCHES_LABEL = "io.patchkit.patches"
# the annotations of an evidence record pushed beside an image (nodes/evidence.py)
EVIDENCE_KIND = "io.patchkit.evidence.kind"
EVIDENCE_VERDICT = "io.patchkit.evidence.verdict"
VLLM_DIR_LABEL = "io.patchkit.vllm.dir"
# What the image holds (see build.Holds): the installed version, the commit it names, the kind
# of source of the pristine tree, and the identity of the base it was laid on (an image cannot
# carry its own fingerprint, which its labels are part of).
INSTALLED_LABEL = "io.patchkit.vllm.installed"
INSTALLED_COMMIT_LABEL = "io.patchkit.vllm.installed.commit"
SOURCE_LABEL = "io.patchkit.vllm.source"
BASE_IDENTITY_LABEL = "io.patchkit.base.identity"
# Each package's version, commit and source ({name: {...}}, JSON), as `patchkit lock` records
# them: `verify --image --locked` compares them with the lock.
PACKAGES_LABEL = "io.patchkit.packages"
# package -> patched file -> the JIT modules built from it (the apply report's jit_modules)
JIT_MODULES_LABEL = "io.patchkit.jit.modules"
# where the image's JIT cache is (FLASHINFER_WORKSPACE_BASE), when it patches a JIT source
JIT_WORKSPACE_LABEL = "io.patchkit.jit.workspace"
# where the cubins FlashInfer downloads at run time are kept (FLASHINFER_CUBIN_DIR): the place
# the base used, set when the JIT cache place moves (moving it moves the cubins' default)
JIT_CUBINS_LABEL = "io.patchkit.jit.cubins"
# the compiled files placed from pinned wheels: [{patch, dist, member, member_sha256, wheel_sha256}]
ARTIFACTS_LABEL = "io.patchkit.artifacts"
BASE_DIGEST_LABEL = "org.opencontainers.image.base.digest"
# Where the image came from (see run_labels): the patchset's commit, its repository, the
# reproducible time, the patchkit that made it
REVISION_LABEL = "org.opencontainers.image.revision"
SOURCE_URL_LABEL = "org.opencontainers.image.source"
CREATED_LABEL = "org.opencontainers.image.created"
PATCHSET_COMMIT_LABEL = "io.patchkit.patchset.commit"
PATCHKIT_VERSION_LABEL = "io.patchkit.version"
OCI_PREFIX = "org.opencontainers.image."
# A time at or before patchkit's fixed commit date (2000-01-01, the date of the commits it
# makes of a release's wheel), the epoch among them, says no time: such a build is
# reproducible, and has no build time to show.
NO_TIME = 946684800
LAYER_LABELS = ("io.patchkit.layer.files", "io.patchkit.layer.bytes",
                "io.patchkit.layer.whiteouts")


def run_labels(manifest: Manifest, tree: AppliedCheckout, *, mode: str, created: int,
               digest: str, packages: dict[str, dict[str, str]] | None = None,
               project: Provenance = Provenance()) -> dict[str, str]:
    """What every image patchkit builds says about the run that made it; ``packages``: each
    package's ``{"version", "commit", "source"}`` by name; ``project``: the patchset's own
    commit and where it is published.

    The OCI annotations say where the image came from as registries and scanners read them:
    ``revision`` the patchset's commit (``-dirty`` when its folder had changes not committed),
    ``source`` the patchset's repository (its origin remote), ``created`` the reproducible
    time (the pinned release's commit time, or SOURCE_DATE_EPOCH), ``version`` the vLLM
    release and the patchset.  All of them are inputs (``build.inputs_key``): the same commit
    and inputs give the same image id, and a new commit a new one, even with the same patches,
    since its labels differ."""
    vllm = tree.vllm
    repo = vllm.source or (manifest.vllm.repos[0] if manifest.vllm.repos else "")
    kind = source.kind_of(repo) if repo else None
    if kind is not None:
        repo = kind.label(repo, str(vllm.version or vllm.ref))
    version = vllm.version or vllm.ref or "unknown"
    patches = [{"id": p.id, "status": p.status} for p in tree.report.patches]
    origin = {SOURCE_URL_LABEL: project.origin} if project.origin else {}
    revision = {REVISION_LABEL: project.revision, PATCHSET_COMMIT_LABEL: project.revision
                } if project.revision else {}
    return {
        "org.opencontainers.image.title": manifest.name,
        **origin,
        **revision,
        "org.opencontainers.image.version": f"{version}+{manifest.name}",
        CREATED_LABEL: layer.iso_time(created),
        PATCHKIT_VERSION_LABEL: __version__,
        "io.patchkit.mode": mode,
        PATCHSET_LABEL: manifest.name,
        "io.patchkit.patchset.digest": digest,
        "io.patchkit.vllm.repo": str(repo),
        "io.patchkit.vllm.ref": str(vllm.ref or ""),
        "io.patchkit.vllm.commit": str(vllm.commit or tree.base),
        VLLM_VERSION_LABEL: str(vllm.version or ""),
        "io.patchkit.vllm.tree": tree.tree_id(),
        SOURCE_LABEL: kind.name if kind is not None else "",
        PATCHES_LABEL: json.dumps(patches, separators=(",", ":")),
        VARIANT_LABEL: tree.report.variant or "",
        PACKAGES_LABEL: json.dumps(packages or {}, sort_keys=True, separators=(",", ":")),
        JIT_MODULES_LABEL: json.dumps(tree.report.jit_modules, sort_keys=True,
                                      separators=(",", ":")),
        ARTIFACTS_LABEL: json.dumps(artifacts_of(manifest, tree.report), sort_keys=True,
                                    separators=(",", ":")),
    }


def build_suffix(labels: dict[str, str], image_id: str) -> str:
    """The hex that names a build for good: the first 12 of its inputs key (the same inputs,
    the same suffix, on every node); an image whose labels carry no inputs key (a source
    build) is named by its image id's instead."""
    key = labels.get(INPUTS_LABEL) or image_id
    return key.split(":", 1)[-1][:SUFFIX_HEX]


def immutable_tag(moving: str, labels: dict[str, str], image_id: str) -> str:
    """The tag that names this build for good beside the moving tag ``moving``:
    ``<moving>-<12 hex>`` (see ``build_suffix``)."""
    repo, tag = split_tag(moving)
    return f"{repo}:{tag}-{build_suffix(labels, image_id)}"


def moving_of(tag: str) -> str | None:
    """The moving tag an immutable tag was made beside (``<moving>-<12 hex>``), or None when
    ``tag`` has no such form."""
    repo, name = split_tag(tag)
    head, sep, suffix = name.rpartition("-")
    if not sep or not head or len(suffix) != SUFFIX_HEX or not re.fullmatch(r"[0-9a-f]+", suffix):
        return None
    return f"{repo}:{head}"


def artifacts_of(manifest: Manifest, report) -> list[dict[str, str]]:
    """The run's applied artifacts, as the label and the lock record them."""
    applied = {p.id for p in report.patches if p.status is Status.APPLIED}
    return [{"patch": p.id, "dist": p.artifact.dist, "member": p.artifact.member,
             "member_sha256": p.artifact.member_sha256, "wheel_sha256": p.artifact.sha256}
            for p in manifest.patches if p.artifact is not None and p.id in applied]


def jit_labels(env: dict[str, str]) -> dict[str, str]:
    """Where the image's JIT cache and cubins live, from the environment the image sets."""
    out = {}
    if env.get(WORKSPACE_ENV):
        out[JIT_WORKSPACE_LABEL] = env[WORKSPACE_ENV]
    if env.get(CUBIN_ENV):
        out[JIT_CUBINS_LABEL] = env[CUBIN_ENV]
    return out


def base_labels(base: layer.BaseImage) -> dict[str, str]:
    """The base an overlay is laid on."""
    return {
        "org.opencontainers.image.base.name": base.name,
        BASE_DIGEST_LABEL: base.digest or base.image_id,
        # store-independent, as the whole config must be: a base's fingerprint needs its
        # config digest, which a containerd store tells only through an export
        BASE_IDENTITY_LABEL: base.identity,
    }


def overlay_labels(key: str, package_dir: str, installed: str | None,
                   made: layer.Layer) -> dict[str, str]:
    """What an overlay layer holds, and the inputs key it was made from."""
    return {
        INPUTS_LABEL: key,
        VLLM_DIR_LABEL: package_dir,
        INSTALLED_LABEL: installed or "",
        INSTALLED_COMMIT_LABEL: versions.named_commit(installed) or "",
        **dict(zip(LAYER_LABELS, (str(made.files), str(made.bytes), str(made.whiteouts)))),
    }


@dataclass(frozen=True)
class ImageFacts:
    """What an image's labels say about how patchkit made it (nothing when it did not)."""

    statuses: dict[str, Status]    # patch id -> status
    vllm_dir: str | None
    installed: str | None
    variant: str | None = None     # the variant built (None: the default build)
    variant_known: bool = False    # the labels say which variant (images patchkit made)
    source: str | None = None      # git | pypi | image
    layer: tuple[int, int, int] = (0, 0, 0)  # the overlay layer's files, bytes, whiteouts
    base_digest: str | None = None
    packages: dict[str, dict[str, str]] | None = None   # None: the labels do not say
    # package -> patched file -> JIT modules (None: the labels do not say)
    jit_modules: dict[str, dict[str, list[str]]] | None = None
    patchset: str | None = None    # the patchset that made it
    inputs: str | None = None      # the inputs key (overlay builds)
    version: str | None = None     # the vLLM release it was applied to
    commit: str | None = None      # the patchset's commit, "-dirty" marked (None: not said)
    created: str | None = None     # when it was made, when that is a real time (see NO_TIME)
    patchkit: str | None = None    # the patchkit version that made it

    @classmethod
    def from_labels(cls, labels: dict[str, str]) -> ImageFacts:
        try:
            statuses = {str(p["id"]): Status(p["status"])
                        for p in json.loads(labels.get(PATCHES_LABEL) or "[]")}
        except (ValueError, TypeError, KeyError):
            statuses = {}
        counts = tuple(_count(labels.get(k)) for k in LAYER_LABELS)
        return cls(statuses, labels.get(VLLM_DIR_LABEL) or None,
                   labels.get(INSTALLED_LABEL) or None,
                   labels.get(VARIANT_LABEL) or None, VARIANT_LABEL in labels,
                   labels.get(SOURCE_LABEL) or None, counts,  # type: ignore[arg-type]
                   labels.get(BASE_DIGEST_LABEL) or None,
                   _packages(labels.get(PACKAGES_LABEL)),
                   _jit_modules(labels.get(JIT_MODULES_LABEL)),
                   labels.get(PATCHSET_LABEL) or None, labels.get(INPUTS_LABEL) or None,
                   labels.get(VLLM_VERSION_LABEL) or None,
                   labels.get(PATCHSET_COMMIT_LABEL) or None,
                   real_time(labels.get(CREATED_LABEL)),
                   labels.get(PATCHKIT_VERSION_LABEL) or None)

    def skipped(self) -> set[str]:
        return {pid for pid, status in self.statuses.items() if status is Status.SKIPPED}


def real_time(text: str | None) -> str | None:
    """``text`` (an RFC 3339 time, as labels and engines write it) when it is a real time;
    None when it is none, unreadable, or not real (at or before ``NO_TIME``: the epoch,
    2000-01-01): a reproducible build's time says nothing of when it was made."""
    if not text:
        return None
    try:
        when = datetime.fromisoformat(re.sub(r"(\.\d{6})\d*", r"\1",
                                             text.strip().replace("Z", "+00:00")))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return text if when.timestamp() > NO_TIME else None


def annotations(labels: dict[str, str]) -> dict[str, str]:
    """The OCI annotations among ``labels`` (``org.opencontainers.image.*``), for a manifest
    that carries them beside its config."""
    return {k: v for k, v in sorted(labels.items()) if k.startswith(OCI_PREFIX)}


def _mapping(text: str | None) -> dict | None:
    """A label holding a JSON object, or None (absent, or not one)."""
    try:
        data = json.loads(text) if text else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _packages(text: str | None) -> dict[str, dict[str, str]] | None:
    data = _mapping(text)
    if data is None:
        return None
    return {str(k): {str(a): str(b) for a, b in v.items()} for k, v in data.items()
            if isinstance(v, dict)}


def _count(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0


def _jit_modules(text: str | None) -> dict[str, dict[str, list[str]]] | None:
    data = _mapping(text)
    if data is None:
        return None
    return {str(n): {str(f): [str(m) for m in mods] for f, mods in files.items()
                     if isinstance(mods, list)}
            for n, files in data.items() if isinstance(files, dict)}


# What a base's config may say of the vLLM it holds, read without pulling a layer: patchkit's
# own labels (a base patchkit built), the OCI version label, an environment variable.
DECLARED_VLLM = (INSTALLED_LABEL, VLLM_VERSION_LABEL, "org.opencontainers.image.version")
VLLM_VERSION_ENV = "VLLM_VERSION"


def declared_vllm(config: dict) -> tuple[str, str] | None:
    """The vLLM version an image's config declares, and which label or variable says it; None
    when nothing does (only its files would say)."""
    inner = config.get("config") or {}
    labels = inner.get("Labels") or {}
    for key in DECLARED_VLLM:
        value = str(labels.get(key) or "").strip()
        if value and versions.parse(value.removeprefix("v")) is not None:
            return value.removeprefix("v"), f"label {key}"
    for entry in inner.get("Env") or ():
        key, _, value = str(entry).partition("=")
        if key == VLLM_VERSION_ENV and versions.parse(value.strip().removeprefix("v")):
            return value.strip().removeprefix("v"), f"env {key}"
    return None
