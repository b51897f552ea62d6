"""The lock file, ``patchset.lock``: the stack an image is proven on, and what the base must hold.

:func:`check_base` judges a base's installed distributions (read by :mod:`distinfo`) against
the manifest: every package's ``dist`` installed at its pin, every ``image.requires``
specifier met.  :class:`Lock` is the lock file, written by :meth:`Lock.render` and read back by
:meth:`Lock.read` alone; :func:`differences` names what a stack has that the lock does not.

The lock is TOML (read with ``tomllib``), sorted, one ``key = "value"`` a line::

    [base]
    name = "vllm/vllm-openai:v0.33.0"
    digest = "sha256:..."

    [packages.vllm]
    version = "0.33.0"
    commit = "..."
    source = "pypi"         # where its pristine tree came from: git, pypi or image

    [installed]
    flashinfer-python = "0.6.15"
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from patchkit import source, versions
from patchkit.errors import ImageError, ManifestError, UsageError
from patchkit.image.distinfo import Installed
from patchkit.manifest import Manifest
from patchkit.series import checkout
from patchkit.source.refs import BASE_REF

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

LOCK_FILE = "patchset.lock"
HEADER = ("# patchset.lock: the stack this patchset was proven on. Written by `patchkit lock`;\n"
          "# review it and commit it. `build-image --locked` refuses a base that differs.\n")


# ------------------------------------------------------------------------- the base's checks

def requires_problems(manifest: Manifest, installed: Installed, base: str,
                      what: str = "base") -> list[str]:
    """One line per ``image.requires`` entry the base (``what``: or the image) does not
    meet."""
    out = []
    for name, spec in sorted(manifest.image.requires.items()):
        dist = installed.get(name)
        if dist is None:
            out.append(f"{what} {base} has no {name} installed ({installed.missing(name)}), "
                       f"image.requires wants {spec}")
        elif not _satisfies(spec, dist.version):
            out.append(f"{what} {base} has {name} {dist.version}, image.requires wants {spec}")
    return out


def _satisfies(spec, version: str) -> bool:
    try:
        return spec.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def check_base(manifest: Manifest, installed: Installed, base: str,
               pins: Mapping[str, str | None] | None = None) -> None:
    """Refuse a base that does not hold the manifest's packages at their pins (a ``dist`` not
    installed is a manifest error at its line) or does not meet ``image.requires``.  ``pins``
    (package name -> version) overrides the version a package's ref names, e.g. from its
    applied checkout.  vLLM's own checks live in the overlay plan."""
    for package in manifest.others:
        dist = installed.get(package.dist)
        if dist is None:
            raise ManifestError(f"packages.{package.name}.dist: base {base} has no {package.dist} "
                                f"installed ({installed.missing(package.dist)})",
                                path=str(manifest.path.name), line=package.dist_line or None)
        if package.ref == BASE_REF:
            continue
        pin = (pins or {}).get(package.name) or versions.expected(None, package.ref)
        if pin and not versions.same_release(dist.version, pin):
            raise ImageError(f"base {base} holds {package.dist} {dist.version}, the pin is "
                             f"{package.ref}")
    problems = requires_problems(manifest, installed, base)
    if problems:
        raise ImageError("; ".join(problems))


# -------------------------------------------------------------------------------- the lock

@dataclass(frozen=True)
class Pinned:
    """A patched package's version and commit, and the kind of source its pristine tree came
    from (``git``, ``pypi``, ``image``).  The commit is "" when no applied checkout said it."""

    version: str
    commit: str
    source: str
    # patched file -> the JIT modules the package builds from it (from the applied checkout)
    jit_modules: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Lock:
    base_name: str
    base_digest: str
    packages: Mapping[str, Pinned] = field(default_factory=dict)
    installed: Mapping[str, str] = field(default_factory=dict)
    # patch id -> {dist, member, member_sha256, wheel_sha256} of each artifact the image ships
    artifacts: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def render(self) -> bytes:
        """The file's bytes: sorted, so that the same stack gives the same bytes."""
        lines = [HEADER, "[base]", f"name = {_q(self.base_name)}",
                 f"digest = {_q(self.base_digest)}"]
        for name in sorted(self.packages):
            p = self.packages[name]
            lines += ["", f"[packages.{name}]", f"version = {_q(p.version)}",
                      f"commit = {_q(p.commit)}", f"source = {_q(p.source)}"]
            if p.jit_modules:
                lines += ["", f"[packages.{name}.jit_modules]"]
                lines += [f"{_q(file)} = [{', '.join(_q(m) for m in mods)}]"
                          for file, mods in sorted(p.jit_modules.items())]
        lines += ["", "[installed]"]
        lines += [f"{name} = {_q(v)}" for name, v in sorted(self.installed.items())]
        for patch in sorted(self.artifacts):
            lines += ["", f"[artifacts.{_q(patch)}]"]
            lines += [f"{k} = {_q(v)}" for k, v in sorted(self.artifacts[patch].items())]
        return ("\n".join(lines) + "\n").encode()

    @classmethod
    def read(cls, path: Path) -> Lock:
        """The lock at ``path``; a missing or malformed one is a usage error (one line)."""
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UsageError(f"{path}: no lock file; write it with `patchkit lock`") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"{path}: cannot read the lock: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"{path}: not a lock file: {exc}") from None
        try:
            base = data["base"]
            packages = {str(k): Pinned(_s(v["version"]), _s(v["commit"]), _s(v["source"]),
                                       {str(f): tuple(_s(m) for m in mods) for f, mods in
                                        (v.get("jit_modules") or {}).items()})
                        for k, v in data.get("packages", {}).items()}
            return cls(_s(base["name"]), _s(base["digest"]), packages,
                       {str(k): _s(v) for k, v in data.get("installed", {}).items()},
                       {str(k): {str(f): _s(x) for f, x in v.items()}
                        for k, v in data.get("artifacts", {}).items()})
        except (KeyError, TypeError, AttributeError) as exc:
            raise UsageError(f"{path}: not a lock file: missing or malformed {exc}") from None


def lock_path(manifest: Manifest) -> Path:
    """Where the manifest's lock file is: beside it."""
    return manifest.root / LOCK_FILE


def read_lock(manifest: Manifest) -> Lock:
    return Lock.read(lock_path(manifest))


def check_packages(manifest: Manifest, lock: Lock, packages: Mapping[str, Pinned]) -> None:
    """Refuse applied packages that differ from the lock (each difference named)."""
    found = package_differences(lock, packages)
    if found:
        raise refused(found, lock_path(manifest), "the applied stack")


def patched_packages(manifest: Manifest, workdir: Path,
                     installed: Installed | None = None) -> dict[str, Pinned]:
    """Each package's version, commit and source kind: from its applied checkout when there is
    one (the source its pristine tree was taken from), else from the manifest's pin (the
    version its ref names, or with ``ref: base`` what ``installed`` holds; the commit unknown;
    the kind of its first source)."""
    out: dict[str, Pinned] = {}
    for package in manifest.packages:
        where = package.checkout(workdir)
        first = source.kind_of(package.repos[0]).name
        if checkout.is_checkout(where):
            info = checkout.AppliedCheckout.open(where)
            pin = info.pin(package.name)
            kind = source.kind_of(pin.source).name if pin.source else first
            modules = info.report.jit_modules.get(package.name, {})
            out[package.name] = Pinned(str(pin.version or pin.ref), str(pin.commit or info.base),
                                       kind, {f: tuple(m) for f, m in modules.items()})
            continue
        version = versions.expected(None, package.ref) or package.ref
        if package.ref == BASE_REF and installed is not None and installed.get(package.dist):
            version = installed.get(package.dist).version
        out[package.name] = Pinned(version, "", first)
    return out


def _q(text: str) -> str:
    # a JSON string of printable text is a TOML basic string
    return json.dumps(str(text), ensure_ascii=True)


def _s(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"value {value!r} (expected a string)")
    return value


def base_differences(lock: Lock, digest: str, installed: Mapping[str, str]) -> list[str]:
    """One line per way a base (its digest, its installed versions) differs from the lock."""
    out = []
    if digest != lock.base_digest:
        out.append(f"base digest {digest}, the lock has {lock.base_digest}")
    for name in sorted(set(lock.installed) | set(installed)):
        have, want = installed.get(name), lock.installed.get(name)
        if have == want:
            continue
        if want is None:
            out.append(f"{name} {have} is installed, the lock has none")
        elif have is None:
            out.append(f"{name} is not installed, the lock has {want}")
        else:
            out.append(f"{name} {have}, the lock has {want}")
    return out


def package_differences(lock: Lock, packages: Mapping[str, Pinned]) -> list[str]:
    """One line per patched package whose version or commit differs from the lock."""
    out = []
    for name in sorted(set(lock.packages) | set(packages)):
        have, want = packages.get(name), lock.packages.get(name)
        if want is None or have is None:
            out.append(f"package {name} is in the {'stack' if want is None else 'lock'}, not "
                       f"in the {'lock' if want is None else 'stack'}")
            continue
        if have.version != want.version:
            out.append(f"package {name} version {have.version}, the lock has {want.version}")
        if have.commit and want.commit and have.commit != want.commit:
            out.append(f"package {name} commit {have.commit[:12]}, the lock has "
                       f"{want.commit[:12]}")
        if have.jit_modules and want.jit_modules and dict(have.jit_modules) != dict(
                want.jit_modules):
            out.append(f"package {name} feeds other JIT modules than the lock names "
                       "(run `patchkit lock` again)")
    return out


def check_locked(manifest: Manifest, lock: Lock, digest: str, installed: Installed,
                 base: str) -> None:
    """Refuse a base (its digest, what it has installed) that differs from ``lock``, naming
    each difference; every build path asks this of the base it lays the layer on."""
    found = base_differences(lock, digest, installed.versions())
    if found:
        raise refused(found, manifest.root / LOCK_FILE, f"base {base}")


def refused(differences: list[str], lock_path: Path, what: str) -> ImageError:
    """The one error a stack that differs from the lock gets: a summary, one line each."""
    head = (f"{what} differs from {lock_path.name} in {len(differences)} "
            f"way{'s' if len(differences) != 1 else ''}")
    return ImageError("\n".join([head, *("  " + d for d in differences)]))
