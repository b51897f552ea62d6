"""Image references and platforms: pure values, checked before any engine is asked (the
manifest loader checks ``image.base`` and ``image.tag`` with them)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from patchkit.errors import Origin, SettingError, literal

PLATFORM = Origin("platform")


@dataclass(frozen=True)
class Platform:
    os: str
    arch: str
    variant: str | None = None

    @classmethod
    def parse(cls, text: str, origin: Origin = PLATFORM) -> "Platform":
        """The platform ``text`` names; ``origin`` says where it came from, as an error names
        it."""
        parts = text.strip().lower().split("/")
        if len(parts) not in (2, 3) or not all(parts):
            raise SettingError(f"{{{origin.setting}}} {literal(repr(text))}: expected "
                               "OS/ARCH[/VARIANT], e.g. linux/arm64", origin)
        arch = {"aarch64": "arm64", "x86_64": "amd64"}.get(parts[1], parts[1])
        return cls(parts[0], arch, parts[2] if len(parts) == 3 else None)

    def matches(self, other: "Platform") -> bool:
        if (self.os, self.arch) != (other.os, other.arch):
            return False
        # arm64 images often carry no variant; v8 is the only one there is.
        return not (self.variant and other.variant) or self.variant == other.variant

    def __str__(self) -> str:
        return "/".join(p for p in (self.os, self.arch, self.variant) if p)


def repository(name: str) -> str:
    """``host:5000/a/b:tag`` or ``a/b@sha256:..`` -> ``host:5000/a/b``."""
    name = name.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
    return name


# The reference grammar of the distribution project, which the engine enforces.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = (r"(?:localhost|\[[0-9a-fA-F:]+\]|[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
           r"(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*)(?::[0-9]+)?")
_NAME = re.compile(rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*")
_TAG = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}")


def reference_problem(ref: str, *, digest_ok: bool = True) -> str | None:
    """Why ``ref`` is not an image reference the engine would take, or None.  Checked before
    anything is built, so that a bad tag is known before the work, not after it."""
    if not ref.strip():
        return "it is empty"
    rest, _, digest = ref.partition("@")
    if digest and not digest_ok:
        return "a tag names no digest (drop the @...)"
    if digest and not _DIGEST.fullmatch(digest):
        return f"{digest!r} is not a digest like sha256:<64 hex digits>"
    name, tag = rest, None
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = rest[: len(rest) - len(last)] + last.split(":", 1)[0], last.split(":", 1)[1]
    if tag is not None and not _TAG.fullmatch(tag):
        return f"the tag {tag!r} is not [A-Za-z0-9_.-], at most 128 characters"
    if len(name) > 255:
        return "the name is longer than 255 characters"
    if not _NAME.fullmatch(name):
        if _NAME.fullmatch(name.lower()):
            return "the repository name must be lowercase"
        return "it is not NAME[:TAG] (lowercase letters, digits, and . _ - / as separators)"
    return None


DOCKER_HUB = "docker.io"


def host_of(name: str) -> str:
    """The registry host a reference names: its first component when that looks like a host
    (has a ``.`` or ``:``, or is ``localhost``), else Docker Hub, as the engine reads it."""
    first, sep, _ = name.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return DOCKER_HUB


# How a registry that never answered is worded, by skopeo and by an engine's pull (Go's net
# and TLS errors), and the cause each one names.
_UNREACHABLE = (
    (re.compile(r"connection refused", re.I), "connection refused"),
    (re.compile(r"no such host|server misbehaving|name resolution|name or service not known|"
                r"lookup \S+ on ", re.I), "its host name does not resolve (DNS)"),
    (re.compile(r"i/o timeout|timeout exceeded|timed out|deadline exceeded|"
                r"Client\.Timeout|no answer within|no answer in time", re.I),
     "no answer in time (a timeout)"),
    (re.compile(r"network is unreachable|no route to host|host is unreachable", re.I),
     "the network cannot reach it"),
    (re.compile(r"connection reset|broken pipe|EOF$", re.I), "the connection was cut"),
    (re.compile(r"server gave HTTP response to HTTPS client", re.I),
     "it speaks HTTP, not HTTPS (an insecure registry: PATCHKIT_INSECURE_REGISTRIES, or the "
     "engine's insecure-registries)"),
    (re.compile(r"TLS handshake|x509:|certificate", re.I), "its TLS certificate or handshake "
     "failed"),
)


def unreachable(said: str) -> str | None:
    """The cause, in a few words, when ``said`` (what skopeo or an engine's pull said) means
    the registry never answered: connection refused, a DNS failure, a timeout...; None when
    the registry did answer (not found, denied, ...)."""
    for pattern, cause in _UNREACHABLE:
        if pattern.search(said):
            return cause
    return None


def split_tag(ref: str) -> tuple[str, str]:
    repo = repository(ref)
    rest = ref[len(repo):]
    return repo, rest[1:] if rest.startswith(":") else "latest"


_RELEASE = re.compile(r"v?\d+(?:\.\d+)+\Z")


def is_template(ref: str) -> bool:
    """Whether an image reference names the release through ``{ref}`` or ``{version}``."""
    return "{ref}" in ref or "{version}" in ref


def fill_release(ref: str, release: str) -> str:
    """A template reference filled for ``release`` (a tag such as ``v0.34.0``)."""
    return ref.replace("{ref}", release).replace("{version}", release.removeprefix("v"))


def moved_to_release(ref: str, old: str, new: str) -> str | None:
    """``ref`` with the release ``old`` its tag names moved to ``new``: a tag that is ``old``
    itself, or that holds ``old``'s version as a word of its own, with or without the ``v``
    (``0.33.0``, ``v0.33.0-cu128``), in the same form.  None when the tag names no such release,
    or the reference is pinned by digest or is a template (neither is rewritten)."""
    if "@" in ref or is_template(ref):
        return None
    name, tag = split_tag(ref)
    if not tag:
        return None
    if tag == old:
        return f"{name}:{new}"
    if not (_RELEASE.match(old) and _RELEASE.match(new)):
        return None
    version = re.escape(old.removeprefix("v"))
    found = re.compile(rf"(?<![0-9A-Za-z.])(v?){version}(?![0-9A-Za-z]|\.[0-9])")
    if not found.search(tag):
        return None
    return f"{name}:{found.sub(lambda m: m.group(1) + new.removeprefix('v'), tag, count=1)}"


def check_reference(origin: Origin, ref: str, *, digest_ok: bool = True) -> None:
    """A usage error naming where ``ref`` came from (``origin``) when it is no image
    reference."""
    problem = reference_problem(ref, digest_ok=digest_ok)
    if problem:
        raise SettingError(f"{{{origin.setting}}} {literal(repr(ref))} is not an image "
                           f"reference: {literal(problem)}", origin)


# ------------------------------------------------------------------------ engine addresses

ENGINE_FORMS = "ssh://[user@]host[:port], unix:///path/to/socket or tcp://host:port"


def engine_problem(text: str) -> str | None:
    """Why ``text`` is not an engine address (see ENGINE_FORMS), or None.  The Docker border
    (``engines.docker.engine_url``) and the manifest's ``image.nodes`` both judge by it."""
    from urllib.parse import urlsplit

    try:
        url = urlsplit(text)
        port = url.port
    except ValueError as exc:
        return str(exc)
    if url.scheme not in ("ssh", "unix", "tcp"):
        return f"expected {ENGINE_FORMS}"
    if url.query or url.fragment:
        return "an engine address has no ?query or #fragment"
    if url.scheme == "unix":
        if url.netloc or not url.path.startswith("/"):
            return "a socket is unix:///absolute/path"
        return None
    if not url.hostname or url.path not in ("", "/") or url.password:
        return ("expected ssh://[user@]host[:port]" if url.scheme == "ssh" else
                "expected tcp://host:port")
    if url.scheme == "tcp" and (port is None or url.username):
        return "expected tcp://host:port"
    return None
