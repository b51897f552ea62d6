"""patchset.yaml: loaded once, strictly, into frozen dataclasses that keep YAML line numbers.

Nothing past this module handles raw dicts.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name

from patchkit import kinds, paths, syntax, versions
from patchkit.errors import ManifestError, SettingError, clipped
from patchkit.imageref import Platform, engine_problem, reference_problem
from patchkit.manifest.model import (ACCEPTANCE_LINE, ID_MAX, ID_RE, PREDICATES, VLLM, Artifact,
                                     Assertion, BumpSettings, Floor, ImageDefaults, Manifest,
                                     Marker, Package, Patch, Retired, Serve, Variant, id_problem,
                                     length_problem, rate_problem, shown_id, summary_problem)
from patchkit import jitrules
from patchkit.source import word_problem
from patchkit.source.refs import BASE_REF, IMAGE_SOURCE, ref_problem

KINDS = kinds.NAMES

# ------------------------------------------------------------------------------------ loading

TOP_KEYS = ("name", "vllm", "packages", "image", "patches", "variants", "runtime", "bump")
BUMP_KEYS = ("probes", "timeout")
VLLM_KEYS = ("repo", "ref")
PACKAGE_KEYS = ("dist", "repo", "ref")
IMAGE_KEYS = ("base", "platform", "tag", "requires", "cuda_arch", "nodes", "serve")
SERVE_KEYS = ("command", "env")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# The keys of a patch entry besides its ranges.  A range key is a package's name, in the same
# mapping, so no package may take one of these names.
ENTRY_KEYS = ("id", "summary", "upstream", "package", *KINDS, "variants", "verify", "replaces",
              "sha256", "runtime", "rebuild", "supersedes", "retired")
RETIRED_KEYS = ("from", "why")
# `rebuild:` words: what to do with a prebuilt compiled module built from a patched file
REBUILD_WORDS = ("jit",)
ARTIFACT_KEYS = ("wheel", "sha256", "member", "member_sha256", "dist")
ASSERTION_KEYS = ("file", "in", *PREDICATES)
MARKER_KEYS = ("log", "absent", "count", "min", "unless", "acceptance", "jit_built")
FLOOR_KEYS = ("min", "min_length")
MAX_PATCH_FILE = 64 * 1024 * 1024   # a diff or transform larger than this is no patch
MAX_MANIFEST = 1 << 20   # bytes of patchset.yaml: a longer one is no manifest (a link to /dev/zero)
MAX_VALUE = 4096   # characters in one string of the manifest (a URL, a path, a regex)

_SHA_RE = re.compile(r"[0-9a-fA-F]{40}\Z")
_SHA256_RE = re.compile(r"[0-9a-fA-F]{64}\Z")
_DIST_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?\Z")   # PEP 508's name
_ONE_OF_KINDS = "give exactly one of " + ", ".join(KINDS)
_ONE_OF_PREDICATES = "give exactly one of " + ", ".join(PREDICATES)


# Constructs the YAML scanner reports where it gives up, not where they begin.
_UNCLOSED = re.compile(r"while (scanning a (quoted|block) scalar|parsing a flow)")


def load(path: Path | str) -> Manifest:
    """Read and check ``path``; raise :class:`ManifestError` at the first mistake.

    Messages name the manifest as the caller spelled it (``patchset.yaml:LINE: ...``); the
    returned ``Manifest`` holds absolute paths.
    """
    given = str(path)
    try:
        mode = os.stat(path).st_mode   # before opening: a FIFO's open waits for a writer
        if stat.S_ISDIR(mode):
            raise IsADirectoryError
        if not stat.S_ISREG(mode):
            raise ManifestError("is not a regular file (a device, a pipe or a socket), not a "
                                "manifest file", path=given)
        with open(path, "rb") as fh:
            data = fh.read(MAX_MANIFEST + 1)
        if len(data) > MAX_MANIFEST:
            raise ManifestError(f"larger than {MAX_MANIFEST >> 20} MiB; a manifest is a short "
                                "text file", path=given)
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise ManifestError("no such file", path=given) from None
    except IsADirectoryError:
        raise ManifestError("is a directory, not a manifest file", path=given) from None
    except UnicodeDecodeError as exc:
        raise ManifestError(f"not UTF-8 text ({exc.reason} at byte {exc.start})",
                            path=given) from None
    except OSError as exc:
        raise ManifestError(f"cannot read: {exc.strerror}", path=given) from None
    absolute = Path(os.path.abspath(path))
    try:
        loader = _Loader(given, absolute, text)
    except yaml.reader.ReaderError as exc:   # a character YAML does not allow (NUL, ...)
        line = text.count("\n", 0, max(exc.position, 0)) + 1
        raise ManifestError(f"YAML syntax error: character #x{exc.character:04x} is not "
                            "allowed in YAML text", path=given, line=line) from None
    return loader.load()


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _where(where: str) -> str:
    return f"{where}: " if where else ""


class _Loader:
    """Walks the composed YAML nodes, so that every message can name a line."""

    def __init__(self, given: str, path: Path, text: str) -> None:
        self.given = given
        self.path = path
        self.root = path.parent
        self.text = text
        self.entry: str | None = None
        self.declared: dict[str, Variant] = {}
        self.packages: dict[str, Package] = {}   # by name, vllm first
        self.yaml = yaml.SafeLoader(text)

    def fail(self, message: str, node: yaml.Node | None = None) -> NoReturn:
        raise ManifestError(message, path=self.given,
                            line=_line(node) if node is not None else None, entry=self.entry)

    # -- YAML plumbing ---------------------------------------------------------------------

    def load(self) -> Manifest:
        try:
            try:
                document = self._document()
            except yaml.MarkedYAMLError as exc:
                mark = exc.problem_mark or exc.context_mark
                problem = exc.problem or "invalid YAML"
                if exc.context and problem.startswith("but "):
                    problem = f"{exc.context}, {problem}"
                elif exc.context:
                    problem += f" ({exc.context})"
                if _UNCLOSED.match(exc.context or "") and exc.context_mark and mark and \
                        exc.context_mark.line < mark.line:
                    # an unclosed quote or bracket is found where the scanner gives up, often
                    # lines later: the line it began on is the one to fix
                    problem += f"; it begins here and is still open at line {mark.line + 1}"
                    mark = exc.context_mark
                raise ManifestError(f"YAML syntax error: {problem}", path=self.given,
                                    line=mark.line + 1 if mark else None) from None
            except yaml.YAMLError as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid YAML"
                raise ManifestError(f"YAML syntax error: {first}", path=self.given) from None
            except RecursionError:
                raise ManifestError("YAML nested too deeply to read", path=self.given) from None
            if document is None:
                self.fail("the manifest is empty; it needs at least name and vllm")
            try:
                return self.manifest(document)
            except RecursionError:
                raise ManifestError("YAML nested too deeply to read", path=self.given) from None
        finally:
            self.yaml.dispose()

    def _document(self) -> yaml.Node | None:
        """The document's node, composed by libyaml where PyYAML has it (several times
        faster); a document libyaml refuses is composed again by the pure parser, whose
        errors say what is wrong as they always did."""
        fast = getattr(yaml, "CSafeLoader", None)
        if fast is not None:
            loader = fast(self.text)
            try:
                node = loader.get_single_node()
            except (yaml.YAMLError, RecursionError):
                loader.dispose()
            else:
                self.yaml.dispose()
                self.yaml = loader
                return node
        return self.yaml.get_single_node()

    def value(self, node: yaml.Node) -> object:
        """The Python value of a scalar node (strings, numbers, booleans, null, dates)."""
        try:
            return self.yaml.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            self.fail(f"unsupported YAML value: {problem}", node)

    def kind(self, node: yaml.Node) -> str:
        if isinstance(node, yaml.MappingNode):
            return "a mapping"
        if isinstance(node, yaml.SequenceNode):
            return "a list"
        value = self.value(node)
        if value is None:
            return "nothing (null)"
        if isinstance(value, bool):
            return f"the boolean {node.value}"
        if isinstance(value, (int, float)):
            return f"the number {node.value}"
        if isinstance(value, str):
            return f"the string {clipped(value)!r}"
        return f"the {type(value).__name__} {node.value}"

    def string(self, node: yaml.Node, what: str, *, empty_ok: bool = False) -> str:
        if isinstance(node, yaml.ScalarNode):
            value = self.value(node)
            if isinstance(value, str):
                if not value.strip() and not empty_ok:
                    self.fail(f"{what}: must not be empty", node)
                if len(value) > MAX_VALUE:
                    self.fail(f"{what}: {clipped(value)!r} is {len(value)} characters long; a "
                              f"value has at most {MAX_VALUE}", node)
                return value
            if value is not None:
                self.fail(f"{what}: expected a string, got {self.kind(node)} "
                          "(quote it to make it a string)", node)
        self.fail(f"{what}: expected a string, got {self.kind(node)}", node)

    def mapping(self, node: yaml.Node, where: str, allowed: tuple[str, ...] | None,
                required: tuple[str, ...] = (), what: str = "a mapping",
                ) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        """The entries of a mapping node by key, in document order, with both nodes kept."""
        if not isinstance(node, yaml.MappingNode):
            self.fail(f"{_where(where)}expected {what}, got {self.kind(node)}", node)
        seen: dict[object, yaml.Node] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                self.fail(f"{_where(where)}keys must be strings, got {self.kind(key_node)}",
                          key_node)
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.value(key_node)
            if key in seen:
                self.fail(f"{_where(where)}duplicate key {key!r} "
                          f"(first on line {_line(seen[key])})", key_node)
            seen[key] = key_node
        try:
            self.yaml.flatten_mapping(node)  # `<<: *anchor` merges; own keys win
        except yaml.YAMLError as exc:
            self.fail(f"{_where(where)}bad merge: {getattr(exc, 'problem', exc)}", node)
        entries: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key_node, value_node in node.value:
            key = self.value(key_node)
            if not isinstance(key, str):
                self.fail(f"{_where(where)}keys must be strings, got {self.kind(key_node)}",
                          key_node)
            if allowed is not None and key not in allowed:
                self.fail(f"{_where(where)}unknown key {key!r}{_suggest(key, allowed)}", key_node)
            entries[key] = (key_node, value_node)
        for key in required:
            if key not in entries:
                self.fail(f"{_where(where)}missing required key {key!r}", node)
        return entries

    # -- the schema ------------------------------------------------------------------------

    def manifest(self, node: yaml.Node) -> Manifest:
        top = self.mapping(node, "", TOP_KEYS, required=("name", "vllm"),
                           what="a mapping with name, vllm and patches")
        name = self.string(top["name"][1], "name").strip()
        vllm = self.vllm(*top["vllm"])
        self.packages = {VLLM.name: vllm}
        others = self.package_entries(top["packages"][1]) if "packages" in top else ()
        image = self.image(top["image"][1]) if "image" in top else ImageDefaults()
        for package in (vllm, *others):
            if package.ref == BASE_REF and not image.base:
                raise ManifestError(f"{package.id.key('ref')}: {BASE_REF!r} pins what the base "
                                    "image holds, and image.base is not set", path=self.given,
                                    line=package.ref_line)
        if "variants" in top:
            self.declared = self.variants(top["variants"][1])
        patches: list[Patch] = []
        if "patches" in top:
            patches_node = top["patches"][1]
            items = self.sequence(patches_node, "patches", "a list of patch entries")
            first_line: dict[str, int] = {}
            for index, item in enumerate(items):
                patches.append(self.patch(item, index, first_line))
            self.successors(patches)
            self.entry = None
        runtime = self.runtime(top["runtime"][1]) if "runtime" in top else ()
        bump = self.bump(top["bump"][1]) if "bump" in top else BumpSettings()
        return Manifest(name=name, root=self.root, path=self.path, vllm=vllm, image=image,
                        patches=tuple(patches), variants=self.declared, runtime=runtime,
                        others=others, bump=bump)

    def bump(self, node: yaml.Node) -> BumpSettings:
        """``bump:``: the probes `patchkit bump` runs in the bumped tree, and their deadline."""
        fields = self.mapping(node, "bump", BUMP_KEYS, what="a mapping with probes and timeout")
        probes: list[str] = []
        if "probes" in fields:
            for i, item in enumerate(self.sequence(fields["probes"][1], "bump.probes",
                                                   "a list of shell commands")):
                probes.append(self.string(item, f"bump.probes[{i}]").strip())
        timeout = BumpSettings.timeout
        if "timeout" in fields:
            value = self.value(fields["timeout"][1])
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                self.fail(f"bump.timeout: expected a number of seconds above 0, got {value!r}",
                          fields["timeout"][1])
            timeout = float(value)
        return BumpSettings(tuple(probes), timeout)

    def sequence(self, node: yaml.Node, where: str, what: str) -> list[yaml.Node]:
        if isinstance(node, yaml.ScalarNode) and self.value(node) is None:
            return []  # `patches:` with nothing under it is an empty series
        if not isinstance(node, yaml.SequenceNode):
            self.fail(f"{where}: expected {what}, got {self.kind(node)}", node)
        return list(node.value)

    def vllm(self, key_node: yaml.Node, node: yaml.Node) -> Package:
        fields = self.mapping(node, "vllm", VLLM_KEYS, required=("repo", "ref"))
        repos = self.repos(fields["repo"][1], "vllm.repo")
        ref_node = fields["ref"][1]
        return Package(VLLM.name, VLLM.dist, repos, self.ref(ref_node, "vllm.ref"), _line(key_node),
                       _line(ref_node))

    def repos(self, node: yaml.Node, what: str) -> tuple[str, ...]:
        """A package's ``repo:``: one source (git URL or path, pypi, image) or a list of them."""
        if isinstance(node, yaml.SequenceNode):
            if not node.value:
                self.fail(f"{what}: the list of repositories is empty", node)
            return tuple(self.source(item, f"{what}[{i}]") for i, item in enumerate(node.value))
        if isinstance(node, yaml.ScalarNode) and isinstance(self.value(node), str):
            return (self.source(node, what),)
        self.fail(f"{what}: expected a string or a list of strings, got {self.kind(node)}", node)

    def source(self, node: yaml.Node, what: str) -> str:
        """One source: a word of the source family, a URL, or a path (from the manifest's
        folder); a typo is said here, with its nearest word."""
        text = self.string(node, what).strip()
        problem = word_problem(text, self.root)
        if problem:
            self.fail(f"{what}: {problem}", node)
        return text

    def ref(self, node: yaml.Node, what: str) -> str:
        ref = self.string(node, what).strip()
        problem = ref_problem(ref)
        if problem:
            self.fail(f"{what}: {problem}", node)
        return ref

    # -- packages beside vllm --------------------------------------------------------------

    def package_entries(self, node: yaml.Node) -> tuple[Package, ...]:
        """``packages:`` at the top: ``NAME: {dist, repo, ref}`` each, in order."""
        if isinstance(node, yaml.ScalarNode) and self.value(node) is None:
            return ()
        fields = self.mapping(node, "packages", None,
                              what="a mapping of package name -> {dist, repo, ref}")
        out: list[Package] = []
        for name, (key_node, value_node) in fields.items():
            self.package_name(name, key_node)
            package = self.package_entry(name, key_node, value_node)
            self.packages[name] = package
            out.append(package)
        return tuple(out)

    def package_name(self, name: str, node: yaml.Node) -> None:
        shown = shown_id(name)
        if name == VLLM.name:
            self.fail("packages: 'vllm' is pinned by the vllm: section; it cannot be declared "
                      "again under packages:", node)
        if not ID_RE.match(name):
            self.fail(f"packages: {shown!r} is not a valid package name (lowercase letters, "
                      "digits and '-', starting with a letter or digit)", node)
        if len(name) > ID_MAX:
            self.fail(f"packages: {shown!r} is {len(name)} characters long; a package name has "
                      f"at most {ID_MAX}", node)
        if name in ENTRY_KEYS:
            self.fail(f"packages: {name!r} is a key of a patch entry, and a package's name is a "
                      f"range key on patches; name the package otherwise (dist: {name} keeps "
                      "its distribution name)", node)

    def package_entry(self, name: str, key_node: yaml.Node, node: yaml.Node) -> Package:
        where = f"packages.{name}"
        fields = self.mapping(node, where, PACKAGE_KEYS, required=("repo",),
                              what="a mapping with dist, repo and ref")
        dist = name
        if "dist" in fields:
            dist_node = fields["dist"][1]
            dist = self.string(dist_node, f"{where}.dist").strip()
            if not _DIST_RE.match(dist):
                self.fail(f"{where}.dist: {dist!r} is not a distribution name (letters, digits, "
                          "'.', '_' and '-', starting and ending with a letter or digit)",
                          dist_node)
        for other in self.packages.values():
            if canonicalize_name(other.dist) == canonicalize_name(dist):
                self.fail(f"{where}.dist: {dist!r} is already the distribution of package "
                          f"{other.name!r} (line {other.line})",
                          fields["dist"][1] if "dist" in fields else key_node)
        repos = self.repos(fields["repo"][1], f"{where}.repo")
        if "ref" not in fields:
            # what the base holds is the only pin a package read from the base can have
            if not all(r == IMAGE_SOURCE for r in repos):
                self.fail(f"{where}: missing required key 'ref'", node)
            return Package(name, dist, repos, BASE_REF, _line(key_node), _line(key_node),
                           _line(fields["dist"][1] if "dist" in fields else key_node))
        ref_node = fields["ref"][1]
        return Package(name, dist, repos, self.ref(ref_node, f"{where}.ref"), _line(key_node),
                       _line(ref_node),
                       _line(fields["dist"][1] if "dist" in fields else key_node))

    def image(self, node: yaml.Node) -> ImageDefaults:
        fields = self.mapping(node, "image", IMAGE_KEYS)
        values: dict[str, str] = {}
        requires: dict[str, SpecifierSet] = {}
        lines: dict[str, int] = {}
        nodes: tuple[str, ...] = ()
        serve: Serve | None = None
        for key, (_, value_node) in fields.items():
            if key == "serve":
                serve = self.serve(value_node)
                continue
            if key == "requires":
                requires, lines = self.requires(value_node)
                continue
            if key == "nodes":
                nodes = self.nodes(value_node)
                continue
            if key == "cuda_arch" and isinstance(value_node, yaml.ScalarNode) and \
                    str(value_node.value).strip():
                values[key] = str(value_node.value).strip()   # 120 and 12.0 as written
                continue
            values[key] = self.string(value_node, f"image.{key}").strip()
        if "cuda_arch" in values and jitrules.parse_arch(values["cuda_arch"]) is None:
            self.fail(f"image.cuda_arch: {values['cuda_arch']!r} is not a CUDA architecture "
                      "FlashInfer knows (like 121a for GB10, 120f, 100a, 90a)",
                      fields["cuda_arch"][1])
        if "platform" in values:
            try:
                Platform.parse(values["platform"])
            except SettingError:
                self.fail(f"image.platform: {values['platform']!r} is not a platform like "
                          "linux/arm64", fields["platform"][1])
        for key in ("base", "tag"):
            if key not in values:
                continue
            filled = re.sub(r"\{(ref|version|name|variant)\}", "x", values[key])
            problem = reference_problem(filled, digest_ok=key == "base")
            if problem:
                self.fail(f"image.{key}: {values[key]!r} is not an image reference: {problem}",
                          fields[key][1])
        return ImageDefaults(**values, requires=requires, requires_lines=lines, nodes=nodes,
                             lines={k: _line(fields[k][1]) for k in values}, serve=serve)

    def serve(self, node: yaml.Node) -> Serve:
        """``image.serve:``: ``command`` (a list of words, run as they are: no shell) and
        ``env`` (a mapping of variable names to values)."""
        fields = self.mapping(node, "image.serve", SERVE_KEYS,
                              what="a mapping with command: [WORD, ...] and env: {NAME: value}")
        command = None
        if "command" in fields:
            items = self.sequence(fields["command"][1], "image.serve.command",
                                  "a list of words, the program first")
            command = tuple(self.string(item, f"image.serve.command[{i}]")
                            for i, item in enumerate(items))
            if not command or not command[0].strip():
                self.fail("image.serve.command: give the program to run, then its arguments",
                          fields["command"][1])
        env: list[tuple[str, str]] = []
        if "env" in fields:
            env_fields = self.mapping(fields["env"][1], "image.serve.env", None,
                                      what="a mapping of variable names to values")
            for name, (key_node, value_node) in env_fields.items():
                if not _ENV_NAME_RE.match(name):
                    self.fail(f"image.serve.env: {name!r} is not a variable name (letters, "
                              "digits and '_', not starting with a digit)", key_node)
                if not isinstance(value_node, yaml.ScalarNode) or value_node.value is None \
                        or value_node.tag.endswith(":null"):
                    self.fail(f"image.serve.env.{name}: give a value (a string, number or "
                              "boolean)", value_node)
                env.append((name, str(value_node.value)))
        return Serve(command, tuple(sorted(env)), _line(node))

    def nodes(self, node: yaml.Node) -> tuple[str, ...]:
        """``image.nodes:``: the engines ``images`` and ``rollback`` reach besides the one
        DOCKER_HOST names, each an engine address, each once."""
        out: list[str] = []
        for i, item in enumerate(self.sequence(node, "image.nodes",
                                               "a list of engine addresses")):
            text = self.string(item, f"image.nodes[{i}]").strip()
            problem = engine_problem(text)
            if problem:
                self.fail(f"image.nodes[{i}]: {text!r} is not an engine address: {problem}",
                          item)
            if text in out:
                self.fail(f"image.nodes[{i}]: {text!r} is listed already", item)
            out.append(text)
        return tuple(out)

    def requires(self, node: yaml.Node) -> tuple[dict[str, SpecifierSet], dict[str, int]]:
        """``image.requires:``: ``DIST: SPECIFIER`` each, by normalized distribution name."""
        if isinstance(node, yaml.ScalarNode) and self.value(node) is None:
            return {}, {}
        fields = self.mapping(node, "image.requires", None,
                              what='a mapping of distribution -> specifier (torch: "==2.11.*")')
        specs: dict[str, SpecifierSet] = {}
        lines: dict[str, int] = {}
        for dist, (key_node, value_node) in fields.items():
            if not _DIST_RE.match(dist):
                self.fail(f"image.requires: {dist!r} is not a distribution name (letters, "
                          "digits, '.', '_' and '-', starting and ending with a letter or digit)",
                          key_node)
            name = canonicalize_name(dist)
            if name in specs:
                self.fail(f"image.requires: {dist!r} is the distribution of line {lines[name]} "
                          "again", key_node)
            specs[name] = self.specifier(value_node, f"image.requires.{dist}")
            lines[name] = _line(value_node)
        return specs, lines

    def patch(self, node: yaml.Node, index: int, first_line: dict[str, int]) -> Patch:
        self.entry = self.entry_name(node, index)
        self.unknown_ranges(node)
        fields = self.mapping(node, "", (*ENTRY_KEYS, *self.packages), required=("id", "summary"),
                              what="a patch entry (a mapping)")
        lines = {key: _line(value_node) for key, (_, value_node) in fields.items()}
        patch_id = self.patch_id(fields["id"][1], first_line)

        summary_node = fields["summary"][1]
        summary = self.string(summary_node, "summary").strip()
        problem = summary_problem(summary)
        if problem:
            self.fail(f"summary: {problem}", summary_node)

        upstream = None
        if "upstream" in fields:
            upstream = self.string(fields["upstream"][1], "upstream").strip()

        given = [key for key in fields if key in KINDS]
        if not given:
            self.fail(f"no patch kind: {_ONE_OF_KINDS}", node)
        if len(given) > 1:
            self.fail(f"{given[1]}: two patch kinds ({given[0]} and {given[1]}) in one entry; "
                      f"{_ONE_OF_KINDS}", fields[given[1]][0])
        kind = given[0]
        artifact = None
        if kind == "artifact":
            artifact = self.artifact(fields[kind][1])
            rel = artifact.wheel
        else:
            rel = self.patch_file(kind, fields[kind][1])

        package = self.patch_package(fields["package"][1]) if "package" in fields else VLLM.name
        ranges = {key: self.specifier(value_node, key)
                  for key, (_, value_node) in fields.items() if key in self.packages}

        replaces: dict[str, str] = {}
        if "replaces" in fields:
            key_node, value_node = fields["replaces"]
            if not kinds.get(kind).replaces_files:
                self.fail(f"replaces: only an overlay patch replaces files (this is a {kind} "
                          "patch)", key_node)
            replaces = self.replaces(value_node, rel)

        sha256 = None
        if "sha256" in fields:
            sha_node = fields["sha256"][1]
            sha256 = self.string(sha_node, "sha256").strip()
            if not _SHA256_RE.match(sha256):
                self.fail(f"sha256: expected the sha256 of the fetched diff (64 hex digits), got "
                          f"{sha256!r}", sha_node)
            sha256 = sha256.lower()

        in_variants: tuple[str, ...] = ()
        if "variants" in fields:
            in_variants = self.patch_variants(fields["variants"][1])

        verify: list[Assertion] = []
        if "verify" in fields:
            items = self.sequence(fields["verify"][1], "verify", "a list of assertions")
            verify = [self.assertion(item, f"verify[{i}]") for i, item in enumerate(items)]

        runtime = self.runtime(fields["runtime"][1]) if "runtime" in fields else ()

        rebuild = None
        if "rebuild" in fields:
            rebuild_node = fields["rebuild"][1]
            rebuild = self.string(rebuild_node, "rebuild").strip()
            if rebuild not in REBUILD_WORDS:
                close = difflib.get_close_matches(rebuild, REBUILD_WORDS, n=1, cutoff=0.5)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                self.fail(f"rebuild: unknown word {rebuild!r}; expected one of "
                          f"{', '.join(REBUILD_WORDS)}{hint}", rebuild_node)
            dist = self.packages[package].dist
            if jitrules.rules_for(dist) is None:
                self.fail(f"rebuild: jit: package {package} ({dist}) has no JIT rules: patchkit "
                          "knows of no module it compiles at run time (only "
                          f"{', '.join(jitrules.RULES)} has them)", rebuild_node)

        supersedes: tuple[str, ...] = ()
        if "supersedes" in fields:
            supersedes = self.supersedes(fields["supersedes"][1], patch_id)

        retired = self.retired(fields["retired"][1], package) if "retired" in fields else None

        patch = Patch(id=patch_id, summary=summary, kind=kind, path=rel, upstream=upstream,
                      package=package, ranges=ranges, verify=tuple(verify), replaces=replaces,
                      line=_line(node), index=index, lines=lines, variants=in_variants,
                      sha256=sha256, runtime=runtime, rebuild=rebuild, artifact=artifact,
                      supersedes=supersedes, retired=retired)
        return patch

    def supersedes(self, node: yaml.Node, patch_id: str) -> tuple[str, ...]:
        """``supersedes: [ID...]``: the patches whose fix this one carries on from, each once
        and never itself (that each exists is judged once every entry is read)."""
        items = self.sequence(node, "supersedes", "a list of patch ids")
        ids: list[str] = []
        for i, item in enumerate(items):
            other = self.string(item, f"supersedes[{i}]").strip()
            if other == patch_id:
                self.fail(f"supersedes[{i}]: a patch cannot supersede itself", item)
            if other in ids:
                self.fail(f"supersedes[{i}]: {other!r} is named twice", item)
            ids.append(other)
        return tuple(ids)

    def retired(self, node: yaml.Node, package: str) -> Retired:
        """``retired: {from: vX, why: "..."}``: a release tag of the patch's package, and the
        reason in one line (that the source has the release is judged where it is read)."""
        fields = self.mapping(node, "retired", RETIRED_KEYS, required=RETIRED_KEYS,
                              what='a mapping {from: vX.Y.Z, why: "..."}')
        ref_node, why_node = fields["from"][1], fields["why"][1]
        ref = self.string(ref_node, "retired.from").strip()
        label = self.packages[package].label
        if versions.release_tag(ref) is None:
            self.fail(f"retired.from: {ref!r} is not a release tag of {label} (vX.Y.Z)",
                      ref_node)
        why = " ".join(self.string(why_node, "retired.why").split())
        if not why:
            self.fail("retired.why: say why the patch is no longer needed", why_node)
        return Retired(ref, why, _line(node))

    def successors(self, patches: Sequence[Patch]) -> None:
        """Each id a ``supersedes:`` names is a patch of the same package in the series, and
        no chain of ``supersedes:`` comes back to where it began (a retired patch's successor
        superseded by it, two fixes each carrying on the other: none would take effect)."""
        by_id = {p.id: p for p in patches}
        self.loops(patches, by_id)
        for p in patches:
            for other in p.supersedes:
                self.entry = p.label
                line = p.lines.get("supersedes")
                if other not in by_id:
                    close = difflib.get_close_matches(other, tuple(by_id), n=1, cutoff=0.6)
                    hint = f"; did you mean {close[0]!r}?" if close else ""
                    raise ManifestError(f"supersedes: no patch has the id {other!r}{hint}",
                                        path=self.given, line=line, entry=self.entry)
                if by_id[other].package != p.package:
                    raise ManifestError(f"supersedes: {other!r} patches {by_id[other].package}, "
                                        f"this patch {p.package}: a fix is carried on within "
                                        "its package", path=self.given, line=line,
                                        entry=self.entry)

    def loops(self, patches: Sequence[Patch], by_id: Mapping[str, Patch]) -> None:
        """One line for the first ``supersedes:`` chain that comes back to its start."""
        def walk(path: list[str]) -> list[str] | None:
            for nxt in by_id[path[-1]].supersedes:
                if nxt == path[0]:
                    return [*path, nxt]
                if nxt in by_id and nxt not in path:
                    found = walk([*path, nxt])
                    if found:
                        return found
            return None

        for p in patches:
            chain = walk([p.id])
            if chain is None:
                continue
            self.entry = p.label
            retired = [x for x in chain[:-1] if by_id[x].retired is not None]
            said = (f"; {', '.join(retired)} {'is' if len(retired) == 1 else 'are'} retired "
                    "as well") if retired else ""
            raise ManifestError(f"supersedes: a loop ({' -> '.join(chain)}): each patch carries "
                                f"on the next one's fix, so none stands alone{said}",
                                path=self.given, line=p.lines.get("supersedes"),
                                entry=self.entry)

    def unknown_ranges(self, node: yaml.Node) -> None:
        """A key that holds a version range but names no package of the manifest: said as such,
        before the loader calls it an unknown key."""
        if not isinstance(node, yaml.MappingNode):
            return
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if (not isinstance(key, str) or key in ENTRY_KEYS or key in self.packages
                    or key_node.tag != "tag:yaml.org,2002:str"
                    or not isinstance(value_node, yaml.ScalarNode)
                    or not _is_specifier(str(value_node.value))):
                continue
            close = difflib.get_close_matches(key, tuple(self.packages), n=1, cutoff=0.6)
            hint = (f"; did you mean {close[0]!r}?" if close else
                    f" (packages: {', '.join(self.packages)}; declare it under packages:)")
            self.fail(f"{key}: a range on package {key!r}, which the manifest does not "
                      f"have{hint}", key_node)

    def patch_package(self, node: yaml.Node) -> str:
        name = self.string(node, "package").strip()
        if name in self.packages:
            return name
        if len(self.packages) == 1:
            self.fail(f"package: unknown package {name!r}: the manifest has only vllm (declare "
                      "others under packages:)", node)
        self.fail(f"package: unknown package {name!r}{_suggest(name, tuple(self.packages))}",
                  node)

    def specifier(self, node: yaml.Node, key: str) -> SpecifierSet:
        text = self.string(node, key).strip()
        try:
            return SpecifierSet(text)
        except InvalidSpecifier:
            self.fail(f"{key}: invalid PEP 440 version specifier {text!r} "
                      "(e.g. \">=0.27.1,<0.33\")", node)

    def variants(self, node: yaml.Node) -> dict[str, Variant]:
        """``variants:`` at the top: ``name: one-line description`` each."""
        if isinstance(node, yaml.ScalarNode) and self.value(node) is None:
            return {}
        fields = self.mapping(node, "variants", None,
                              what="a mapping of variant name -> one-line description")
        out: dict[str, Variant] = {}
        for name, (key_node, value_node) in fields.items():
            if not ID_RE.match(name):
                self.fail(f"variants: {name!r} is not a valid variant name (lowercase letters, "
                          "digits and '-', starting with a letter or digit)", key_node)
            description = self.string(value_node, f"variants.{name}").strip()
            if "\n" in description:
                self.fail(f"variants.{name}: the description must be one line", value_node)
            out[name] = Variant(name, description, _line(key_node))
        return out

    def entry_name(self, node: yaml.Node, index: int) -> str:
        """``patches[N] (id=X)`` when the entry has a string id, else ``patches[N]``: errors
        name the entry before its keys are checked."""
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if (isinstance(key_node, yaml.ScalarNode) and key_node.value == "id"
                        and isinstance(value_node, yaml.ScalarNode)
                        and isinstance(self.value(value_node), str)):
                    return f"patches[{index}] (id={shown_id(str(value_node.value))})"
        return f"patches[{index}]"

    def patch_id(self, id_node: yaml.Node, first_line: dict[str, int]) -> str:
        """A valid id no earlier entry has; ``first_line`` remembers where each was given."""
        patch_id = self.string(id_node, "id")
        problem = id_problem(patch_id)
        if problem:
            self.fail(f"id: {shown_id(patch_id)!r} is {problem}", id_node)
        if patch_id in first_line:
            self.fail(f"id: duplicate id {patch_id!r} (first used on line "
                      f"{first_line[patch_id]})", id_node)
        first_line[patch_id] = _line(id_node)
        return patch_id

    def patch_variants(self, node: yaml.Node) -> tuple[str, ...]:
        """A patch's ``variants: [NAME...]``: each declared at the top, none twice."""
        if not isinstance(node, yaml.SequenceNode):
            self.fail(f"variants: expected a list of variant names, got {self.kind(node)}", node)
        if not node.value:
            self.fail("variants: the list is empty; drop the key to put the patch in every "
                      "build", node)
        names: list[str] = []
        for i, item in enumerate(node.value):
            name = self.string(item, f"variants[{i}]").strip()
            if name in names:
                self.fail(f"variants[{i}]: {name!r} is named twice", item)
            if name not in self.declared:
                if not self.declared:
                    self.fail(f"variants[{i}]: unknown variant {name!r}: the manifest declares "
                              "no variants (add `variants:` at the top, name: description)", item)
                self.fail(f"variants[{i}]: unknown variant {name!r}"
                          f"{_suggest(name, tuple(self.declared))}", item)
            names.append(name)
        return tuple(names)

    def artifact(self, node: yaml.Node) -> Artifact:
        fields = self.mapping(node, "artifact", ARTIFACT_KEYS, required=ARTIFACT_KEYS,
                              what="a mapping of wheel, sha256, member, member_sha256, dist")
        wheel_node = fields["wheel"][1]
        wheel = self.string(wheel_node, "artifact.wheel").strip()
        if wheel.startswith("https://"):
            if not wheel.endswith(".whl"):
                self.fail(f"artifact.wheel: {wheel} is not a wheel (.whl)", wheel_node)
        elif "://" in wheel:
            self.fail(f"artifact.wheel: {wheel!r}: give a path beside the manifest or an "
                      "https URL", wheel_node)
        else:
            wheel = self.patch_file("artifact", wheel_node)
        sums = {}
        for key in ("sha256", "member_sha256"):
            value = self.string(fields[key][1], f"artifact.{key}").strip()
            if not _SHA256_RE.match(value):
                self.fail(f"artifact.{key}: expected a sha256 (64 hex digits), got {value!r}",
                          fields[key][1])
            sums[key] = value.lower()
        member_node = fields["member"][1]
        member = self.string(member_node, "artifact.member").strip()
        try:
            member = str(paths.check_relative(member))
        except paths.UnsafePathError as exc:
            self.fail(f"artifact.member: {exc}", member_node)
        dist = canonicalize_name(self.string(fields["dist"][1], "artifact.dist").strip())
        return Artifact(wheel, sums["sha256"], member, sums["member_sha256"], dist)

    def checked_path(self, node: yaml.Node, what: str) -> str:
        rel = self.string(node, what).strip()
        try:
            pure = paths.check_relative(rel)
        except paths.UnsafePathError as exc:
            self.fail(f"{what}: {exc}", node)
        if not pure.parts:
            self.fail(f"{what}: {rel!r} names the folder itself, not a path inside it", node)
        return str(pure)

    def patch_file(self, kind: str, node: yaml.Node) -> str:
        rel = self.checked_path(node, kind)
        full = self.root / rel
        if os.path.lexists(full) and not paths.is_within(self.root, full):
            self.fail(f"{kind}: {rel} leads outside the manifest's folder (through a symlink)",
                      node)
        plugin = kinds.get(kind)
        if plugin.is_folder:
            if full.exists() and not full.is_dir():
                self.fail(f"{kind}: {rel} is a file; an {kind} is a directory of files laid "
                          "over the checkout", node)
            if not full.is_dir():
                self.fail(f"{kind}: no such directory: {rel}", node)
        else:
            if not full.exists():
                self.fail(f"{kind}: no such file: {rel}", node)
            if not full.is_file():
                self.fail(f"{kind}: {rel} is not a file", node)
            size = full.stat().st_size
            if size > MAX_PATCH_FILE and getattr(plugin, "reads_whole", True):  # read whole by every verb: refuse before reading
                self.fail(f"{kind}: {rel} is {size >> 20} MiB; a patch file is at most "
                          f"{MAX_PATCH_FILE >> 20} MiB", node)
        problem = plugin.check(full, rel)
        if problem:
            self.fail(f"{kind}: {problem}", node)
        return rel

    def replaces(self, node: yaml.Node, overlay: str) -> dict[str, str]:
        fields = self.mapping(node, "replaces", None,
                              what="a mapping of checkout file -> upstream blob sha")
        out: dict[str, str] = {}
        for key, (key_node, value_node) in fields.items():
            try:
                rel = str(paths.check_relative(key))
            except paths.UnsafePathError as exc:
                self.fail(f"replaces: {exc}", key_node)
            full = self.root / overlay / rel
            if not full.is_file() or not paths.is_within(self.root / overlay, full):
                self.fail(f"replaces: {rel} is not a file under the overlay {overlay}", key_node)
            sha = self.string(value_node, f"replaces[{rel}]").strip()
            if not _SHA_RE.match(sha):
                self.fail(f"replaces[{rel}]: expected the upstream git blob sha (40 hex "
                          f"digits), got {sha!r}", value_node)
            out[rel] = sha.lower()
        return out

    def assertion(self, node: yaml.Node, where: str) -> Assertion:
        fields = self.mapping(node, where, ASSERTION_KEYS, required=("file",),
                              what="an assertion (a mapping)")
        predicates = [key for key in fields if key in PREDICATES]
        if not predicates:
            self.fail(f"{where}: no predicate; {_ONE_OF_PREDICATES}", node)
        if len(predicates) > 1:
            self.fail(f"{where}: two predicates ({predicates[0]} and {predicates[1]}); "
                      f"{_ONE_OF_PREDICATES}", fields[predicates[1]][0])
        file = self.checked_path(fields["file"][1], f"{where}.file")
        language = syntax.for_file(file)
        scope = None
        if "in" in fields:
            scope_node = fields["in"][1]
            scope = self.string(scope_node, f"{where}.in").strip()
            problem = language.scope_problem(scope)
            if problem:
                self.fail(f"{where}.in: {problem}", scope_node)
        predicate = predicates[0]
        key_node, value_node = fields[predicate]
        if predicate == "not_contains":  # the same as `not: {contains: TEXT}`
            value = self.predicate_value(language, "contains", value_node, where,
                                         shown="not_contains", key=key_node)
            negated = Assertion(file=file, scope=scope, predicate="contains", value=value,
                                line=_line(key_node))
            return Assertion(file=file, scope=scope, predicate="not", value=None,
                             negated=negated, line=_line(node))
        if predicate != "not":
            value = self.predicate_value(language, predicate, value_node, where, key=key_node)
            return Assertion(file=file, scope=scope, predicate=predicate, value=value,
                             line=_line(node))
        inner_where = f"{where}.not"
        if isinstance(value_node, yaml.MappingNode):
            for inner_key, _ in value_node.value:
                if isinstance(inner_key, yaml.ScalarNode) and inner_key.value in ("file", "in"):
                    self.fail(f"{inner_where}: {inner_key.value!r} is not allowed inside 'not' "
                              "(it checks the assertion's own file and scope)", inner_key)
        allowed = tuple(p for p in PREDICATES if p not in ("not", "not_contains"))
        inner = self.mapping(value_node, inner_where, PREDICATES,
                             what="a mapping with one predicate")
        inner_predicates = list(inner)
        if not inner_predicates:
            self.fail(f"{inner_where}: no predicate; give exactly one of {', '.join(allowed)}",
                      value_node)
        if len(inner_predicates) > 1:
            self.fail(f"{inner_where}: two predicates ({inner_predicates[0]} and "
                      f"{inner_predicates[1]}); give exactly one of {', '.join(allowed)}",
                      inner[inner_predicates[1]][0])
        inner_predicate = inner_predicates[0]
        inner_key, inner_value = inner[inner_predicate]
        if inner_predicate in ("not", "not_contains"):
            self.fail(f"{inner_where}: {inner_predicate!r} inside 'not'; state the predicate itself",
                      inner_key)
        value = self.predicate_value(language, inner_predicate, inner_value, inner_where,
                                     key=inner_key)
        negated = Assertion(file=file, scope=scope, predicate=inner_predicate, value=value,
                            line=_line(inner_key))
        return Assertion(file=file, scope=scope, predicate="not", value=None, negated=negated,
                         line=_line(node))

    def predicate_value(self, language: syntax.Language, predicate: str, node: yaml.Node,
                        where: str, *, shown: str | None = None,
                        key: yaml.Node | None = None) -> str:
        what = f"{where}.{shown or predicate}"
        if predicate not in language.predicates:
            self.fail(f"{what}: {predicate} does not apply to {language.name} files; give one "
                      f"of {', '.join(language.predicates)}", key if key is not None else node)
        if predicate == "has_key":
            return self.string(node, what, empty_ok=True)
        value = self.string(node, what)
        problem = language.value_problem(predicate, value)
        if problem:
            self.fail(f"{what}: {problem}", node)
        return value

    # -- runtime markers -------------------------------------------------------------------

    def runtime(self, node: yaml.Node) -> tuple[Marker, ...]:
        items = self.sequence(node, "runtime", "a list of markers ({log: REGEX, ...})")
        return tuple(self.marker(item, f"runtime[{i}]") for i, item in enumerate(items))

    def marker(self, node: yaml.Node, where: str) -> Marker:
        fields = self.mapping(node, where, MARKER_KEYS,
                              what="a marker (a mapping with log: REGEX)")
        if "acceptance" in fields:
            return self.acceptance_marker(node, fields, where)
        built = None
        if "jit_built" in fields:
            if "log" in fields:
                self.fail(f"{where}: log and jit_built together; jit_built: MODULE is a log "
                          "line in the package's own wording", fields["jit_built"][0])
            built = self.string(fields["jit_built"][1], f"{where}.jit_built").strip()
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", built):
                self.fail(f"{where}.jit_built: {built!r} is not a JIT module name (like norm or "
                          "fused_moe_120)", fields["jit_built"][1])
            log = jitrules.built_pattern(built)
        elif "log" not in fields:
            self.fail(f"{_where(where)}missing required key 'log'", node)
        else:
            log = self.regex(fields["log"][1], f"{where}.log")
        absent = False
        if "absent" in fields:
            absent_node = fields["absent"][1]
            absent = self.value(absent_node) if isinstance(absent_node, yaml.ScalarNode) else None
            if not isinstance(absent, bool):
                self.fail(f"{where}.absent: expected true or false, got "
                          f"{self.kind(absent_node)}", absent_node)
        counts = {key: self.whole_number(fields[key][1], f"{where}.{key}")
                  for key in ("count", "min") if key in fields}
        if len(counts) == 2:
            self.fail(f"{where}: count and min together; give one (count: exactly N lines, "
                      "min: at least N)", fields["min"][0])
        for key in counts:
            if absent:
                self.fail(f"{where}: absent: true with {key}; a forbidden line has no count "
                          f"(absent: true is count: 0)", fields[key][0])
        if counts.get("min") == 0:
            self.fail(f"{where}.min: 0 always holds; give min: 1 or more, or absent: true",
                      fields["min"][1])
        unless = self.regex(fields["unless"][1], f"{where}.unless") if "unless" in fields else None
        return Marker(log=log, absent=absent, count=counts.get("count"),
                      minimum=counts.get("min"), unless=unless, line=_line(node),
                      jit_built=built)

    def acceptance_marker(self, node: yaml.Node, fields: dict, where: str) -> Marker:
        """``acceptance: {min: RATE, min_length: L}``, with ``unless`` and nothing else."""
        for key in fields:
            if key not in ("acceptance", "unless"):
                self.fail(f"{where}: {key!r} with acceptance; an acceptance marker takes only "
                          "unless (it is judged on vLLM's spec-decode metrics lines)",
                          fields[key][0])
        what = f"{where}.acceptance"
        floor_node = fields["acceptance"][1]
        floor = self.mapping(floor_node, what, FLOOR_KEYS,
                             what="a floor ({min: RATE, min_length: L})")
        if not floor:
            self.fail(f"{what}: give min (a rate from 0 to 1), min_length (1 or more) or both",
                      floor_node)
        values = {}
        for key, check in (("min", rate_problem), ("min_length", length_problem)):
            if key in floor:
                value_node = floor[key][1]
                value = self.value(value_node) if isinstance(value_node, yaml.ScalarNode) \
                    else None
                problem = check(value)
                if problem:
                    got = "" if isinstance(value, (int, float)) and not isinstance(value, bool) \
                        else f", got {self.kind(value_node)}"
                    self.fail(f"{what}.{key}: {problem}{got}", value_node)
                values[key] = float(value)
        unless = self.regex(fields["unless"][1], f"{where}.unless") if "unless" in fields else None
        return Marker(log=ACCEPTANCE_LINE, unless=unless, line=_line(node),
                      acceptance=Floor(values.get("min"), values.get("min_length")))

    def regex(self, node: yaml.Node, what: str) -> str:
        text = self.string(node, what)
        try:
            pattern = re.compile(text)
        except re.error as exc:
            at = f" at position {exc.pos}" if exc.pos is not None else ""
            self.fail(f"{what}: {text!r} is not a valid regular expression: {exc.msg}{at}", node)
        except (RecursionError, OverflowError, ValueError) as exc:
            self.fail(f"{what}: {text!r} is not a valid regular expression: {exc}", node)
        if pattern.search(""):
            self.fail(f"{what}: {text!r} matches the empty string, so every line matches it",
                      node)
        return text

    def whole_number(self, node: yaml.Node, what: str) -> int:
        value = self.value(node) if isinstance(node, yaml.ScalarNode) else None
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(f"{what}: expected a whole number of lines, got {self.kind(node)}", node)
        if value < 0:
            self.fail(f"{what}: {value} is negative; give a number of lines (0 or more)", node)
        return value


def _is_specifier(text: str) -> bool:
    if not re.match(r"\s*(==|!=|<=|>=|~=|<|>)", text):
        return False   # a bare word is no range, even where PEP 440 would take it
    try:
        SpecifierSet(text)
    except InvalidSpecifier:
        return False
    return True


def _suggest(key: str, allowed: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f" (expected one of: {', '.join(allowed)})"
