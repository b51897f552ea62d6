"""The libcst transform kind, owner of libcst: authoring API, runner and plug-in.

A transform patch is a Python file under ``patches/`` that defines one or more subclasses of
:class:`Transform`, each editing one file of the checkout::

    import libcst as cst
    import libcst.matchers as m
    from patchkit.transform import Transform

    class UseB12x(Transform):
        path = "vllm/config/speculative.py"

        def postcondition(self, module: cst.Module) -> bool:
            # True once the change is in place; checked before (True -> "upstream") and after.
            return self.has(module, m.SimpleString('"b12x"'))

        def transform(self, module: cst.Module) -> cst.Module:
            # anchor() demands exactly one match: 0 -> anchor-missing, 2+ -> ambiguous-anchor.
            old = self.anchor(module, m.SimpleString('"flashinfer_b12x"'), "the draft MoE backend")
            # with_changes keeps the node's parentheses and comments; a fresh node would drop them
            return module.deep_replace(old, old.with_changes(value='"b12x"'))

The runner never skips silently: a missing anchor, a second hit, a postcondition that does not
hold afterwards, or a result that does not re-parse and compile fails the patch.  Classes run in
the order they are defined.  ``self.version`` is the vLLM release being patched (a
``packaging.version.Version``, or ``None`` when unknown), for the rare fix that must differ by
release; prefer a ``vllm:`` range in the manifest.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from typing import TYPE_CHECKING

from packaging.version import Version

from patchkit import interrupt, paths, process, progress, syntax
from patchkit.errors import clipped
from patchkit.kinds import memo
from patchkit.kinds.base import KindError, Reader, Rebase, Remains, Stop, Target
from patchkit.kinds.common import ABORT, dirty_resume
from patchkit.report import Outcome, PatchResult, Reason, Status
from patchkit.timeouts import DEFAULT_TIMEOUT

if TYPE_CHECKING:
    import libcst as cst
    import libcst.matchers as m


def _cst():
    """libcst, imported when a transform runs: a result kept by content needs none."""
    import libcst

    return libcst


class AnchorError(Exception):
    """Raised by :meth:`Transform.anchor`; ``reason`` is a contract failure reason."""

    reason = Reason.ANCHOR_MISSING

    def __init__(self, message: str) -> None:
        super().__init__(message)


class AnchorMissingError(AnchorError):
    reason = Reason.ANCHOR_MISSING


class AmbiguousAnchorError(AnchorError):
    reason = Reason.AMBIGUOUS_ANCHOR


class ReadError(Exception):
    """A file, or a transform's result, does not parse (or compile)."""


class Transform:
    """Base class of a transform.  Subclasses set ``path`` and define two methods."""

    #: the file this transform edits, relative to the checkout root
    path: str = ""
    #: its result follows from that file, the release and the transform's own folder alone, so
    #: it is kept and reused (set False when it reads anything else: the environment, the
    #: clock, files elsewhere)
    pure: bool = True
    #: what ``transform()`` returns, as failures name it
    result_type = "libcst.Module"
    #: the languages (``patchkit.syntax``) of the files this base class edits
    languages: tuple[str, ...] = ("Python",)

    def __init__(self, version: Version | None = None) -> None:
        self.version = version

    # -- to be written by the patch author ---------------------------------------------------
    def postcondition(self, module: cst.Module) -> bool:
        """True when the file already has the change."""
        raise NotImplementedError

    def transform(self, module: cst.Module) -> cst.Module:
        """Return the changed module.  Find every edit point with :meth:`anchor`."""
        raise NotImplementedError

    # -- how the runner reads and checks this kind of file -------------------------------------
    @classmethod
    def read(cls, text: str) -> cst.Module:
        cst = _cst()
        try:
            return cst.parse_module(text)
        except cst.ParserSyntaxError as exc:
            raise ReadError(exc.message) from None

    @classmethod
    def written(cls, result: object) -> str | None:
        return result.code if isinstance(result, _cst().Module) else None

    @classmethod
    def check_result(cls, before: str, text: str) -> None:
        try:
            compile(text, cls.path, "exec")
        except (SyntaxError, ValueError) as exc:
            raise ReadError(str(exc)) from None

    # -- helpers ------------------------------------------------------------------------------
    @staticmethod
    def find(tree: cst.CSTNode, matcher: m.BaseMatcherNode) -> Sequence[cst.CSTNode]:
        """Every node under ``tree`` (itself included) that ``matcher`` matches."""
        import libcst.matchers

        return libcst.matchers.findall(tree, matcher)

    @classmethod
    def has(cls, tree: cst.CSTNode, matcher: m.BaseMatcherNode) -> bool:
        return bool(cls.find(tree, matcher))

    @classmethod
    def anchor(cls, tree: cst.CSTNode, matcher: m.BaseMatcherNode, what: str) -> cst.CSTNode:
        """The one node under ``tree`` that ``matcher`` matches; anything else fails the patch."""
        hits = cls.find(tree, matcher)
        if not hits:
            raise AnchorMissingError(f"anchor not found: {what}")
        if len(hits) > 1:
            raise AmbiguousAnchorError(f"anchor matches {len(hits)} places: {what}")
        return hits[0]

    @classmethod
    def scope(cls, module: cst.Module, dotted: str) -> cst.CSTNode:
        """The class or function named by ``Class.method`` (top level first), exactly once."""
        node: cst.CSTNode = module
        walked: list[str] = []
        for name in dotted.split("."):
            walked.append(name)
            body = _body_of(node)
            hits = [s for s in body if isinstance(s, (_cst().ClassDef, _cst().FunctionDef))
                    and s.name.value == name]
            if not hits:
                raise AnchorMissingError(f"anchor not found: {'.'.join(walked)}")
            if len(hits) > 1:
                raise AmbiguousAnchorError(
                    f"anchor matches {len(hits)} places: {'.'.join(walked)}")
            node = hits[0]
        return node


@dataclass(frozen=True)
class Span:
    """A stretch of a C/C++ file's text: ``text`` is ``file[start:end]``."""

    start: int
    end: int
    text: str

    def contains(self, needle: str) -> bool:
        return needle in self.text


class CxxTransform(Transform):
    """A transform of a C, C++ or CUDA file (``.c .cc .cpp .h .hpp .cu .cuh``): text edits at
    anchors that must be found exactly once, as in a Python transform::

        class RestoreLowLatency(CxxTransform):
            path = "flashinfer/data/csrc/fused_moe/cutlass_backend/cutlass_fused_moe_kernels.cuh"

            def postcondition(self, source: Span) -> bool:
                fn = self.function(source, "CutlassMoeFCRunner::computeStridesLowLatency")
                return not fn.contains("TLLM_THROW")

            def transform(self, source: Span) -> str:
                fn = self.function(source, "CutlassMoeFCRunner::computeStridesLowLatency")
                throw = self.anchor(fn, 'TLLM_THROW("no longer supported");', "the throw")
                return self.replace(source, throw, "return launchLowLatency(...);")

    ``postcondition`` and ``transform`` receive the whole file as a :class:`Span`;
    ``transform`` returns the new text.  The result must parse with no more error nodes than
    the file had (tree-sitter's grammar of the file's suffix), and the postcondition must hold
    on it.
    """

    result_type = "str"
    languages = ("C", "C++", "CUDA")

    @classmethod
    def read(cls, text: str) -> Span:  # type: ignore[override]
        return Span(0, len(text), text)

    @classmethod
    def written(cls, result: object) -> str | None:
        return result if isinstance(result, str) else None

    @classmethod
    def check_result(cls, before: str, text: str) -> None:
        language = _language(cls.path)
        had, has = language.error_count(before), language.error_count(text)
        if has > had:
            raise ReadError(f"it leaves {has} {language.name} syntax error nodes where the "
                            f"file had {had}")

    @classmethod
    def function(cls, source: Span, name: str) -> Span:
        """The one definition ``name`` names (``f``, ``Class::method``, ``ns::f``; template
        arguments ignored), with its ``template <...>`` line: 0 -> anchor-missing, 2+ ->
        ambiguous-anchor."""
        spans = _language(cls.path).definition_spans(source.text, name)
        if not spans:
            raise AnchorMissingError(f"anchor not found: {name}")
        if len(spans) > 1:
            raise AmbiguousAnchorError(f"anchor matches {len(spans)} places: {name}")
        start, end = spans[0]
        return Span(source.start + start, source.start + end, source.text[start:end])

    @classmethod
    def anchor(cls, within: Span, needle: str, what: str) -> Span:  # type: ignore[override]
        """The one place ``needle`` (literal text) occurs inside ``within``."""
        hits = within.text.count(needle)
        if not hits:
            raise AnchorMissingError(f"anchor not found: {what}")
        if hits > 1:
            raise AmbiguousAnchorError(f"anchor matches {hits} places: {what}")
        at = within.text.index(needle)
        return Span(within.start + at, within.start + at + len(needle), needle)

    @staticmethod
    def replace(source: Span, span: Span, new: str) -> str:
        """The file's text with ``span`` replaced by ``new``."""
        return source.text[:span.start] + new + source.text[span.end:]


def _language(path: str):
    return syntax.for_file(path)


def _body_of(node: cst.CSTNode) -> Sequence[cst.CSTNode]:
    if isinstance(node, _cst().Module):
        return node.body
    body = getattr(node, "body", None)
    inner = getattr(body, "body", None)
    return inner if inner is not None else ()


class TransformLoadError(Exception):
    """The transform file cannot be imported or defines no Transform.  ``detail`` is the
    message without the file's name; ``line`` the line at fault in the file, when known."""

    def __init__(self, py_file: Path, detail: str, line: int | None = None) -> None:
        super().__init__(f"{py_file}: {detail}")
        self.py_file = py_file
        self.detail = detail
        self.line = line

    def __reduce__(self):   # it comes back from the transform worker
        return (type(self), (self.py_file, self.detail, self.line))


def sibling(here: str, filename: str) -> types.ModuleType:
    """The transform file ``filename`` beside the one whose ``__file__`` is ``here``, loaded under
    a private name: a transform that reuses another's pieces (its anchors, its helper's text)
    instead of copying them.  The files beside a transform are part of its kept result's key."""
    path = Path(here).with_name(filename)
    spec = importlib.util.spec_from_file_location(f"_patchkit_sibling_{abs(hash(str(path)))}",
                                                  path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_transforms(py_file: Path) -> list[type[Transform]]:
    """Import ``py_file`` under a private name; return its Transform subclasses in source order."""
    name = f"_patchkit_transform_{abs(hash(str(py_file.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, py_file)
    if spec is None or spec.loader is None:
        raise TransformLoadError(py_file, "cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise TransformLoadError(py_file, f"import failed: SyntaxError: {exc.msg}",
                                 exc.lineno) from exc
    except _STOPS:
        raise
    except BaseException as exc:  # noqa: BLE001  # the author's code: one line, no traceback
        raise TransformLoadError(py_file, f"import failed: {_said(exc)}",
                                 _line_in(exc, py_file)) from exc
    finally:
        sys.modules.pop(name, None)
    found = [obj for obj in vars(module).values()
             if inspect.isclass(obj) and issubclass(obj, Transform) and obj is not Transform
             and obj.__module__ == name]
    if not found:
        raise TransformLoadError(py_file, "defines no patchkit.transform.Transform subclass", 1)
    # vars() keeps definition order, which is the order the classes run in
    for cls in found:
        line = _class_line(cls) if not isinstance(cls.path, str) or not cls.path else None
        if not cls.path:
            raise TransformLoadError(py_file, f"{cls.__name__} sets no `path`", line)
        if not isinstance(cls.path, str):
            raise TransformLoadError(py_file, f"{cls.__name__}.path must be a checkout-relative "
                                     f"path string, not {cls.path!r}", line)
        language = _language(cls.path).name
        if language not in cls.languages:
            base = "CxxTransform" if language != "Python" else "Transform"
            raise TransformLoadError(py_file, f"{cls.__name__} edits a {language} file "
                                     f"({cls.path}); subclass patchkit.transform.{base}",
                                     _class_line(cls))
    return found


# What the author's code raises is theirs to report, in one line, whatever it is (SystemExit,
# GeneratorExit): only the stops of the run itself go on up.
_STOPS = (KeyboardInterrupt, interrupt.Interrupted)


def _said(exc: BaseException) -> str:
    """What the author's code raised, in one line of bounded length."""
    return f"{type(exc).__name__}: {clipped(str(exc))}"


def _line_in(exc: BaseException, py_file: Path) -> int | None:
    """The line of ``py_file`` the exception was raised through last (its deepest frame
    there), or None."""
    wanted = str(py_file)
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == wanted:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _class_line(cls: type) -> int | None:
    """The line of ``cls``'s ``class`` statement in the file it was imported from, or None."""
    import ast

    try:
        tree = ast.parse(Path(_file_of(cls)).read_bytes())
    except (OSError, SyntaxError, ValueError, TypeError):
        return None
    return next((node.lineno for node in ast.walk(tree)
                 if isinstance(node, ast.ClassDef) and node.name == cls.__name__), None)


def _file_of(cls: type) -> str | None:
    return next((v.__code__.co_filename for v in vars(cls).values() if inspect.isfunction(v)),
                None)


def run_transform_file(py_file: Path, root: Path, version: Version | None,
                       cache: Path | None = None, timeout: float = DEFAULT_TIMEOUT) -> Outcome:
    """Apply every transform in ``py_file`` to the checkout at ``root``, all or nothing.

    The author's code (the file's import and its classes' methods) runs in the transform
    worker (``process.Worker``), under a deadline of ``timeout`` seconds of CPU time for the
    file's classes together (and ten times that on the clock): one that runs past it, or a run
    that a signal ends, kills it wherever it is, even inside C code that never returns to the
    interpreter.

    A transform is a pure function of its code and the files it reads, so its result is kept
    in the run's cache (``cache``; None: nothing kept) under the digest of both (``memo``): the
    same transform on the same release file writes the same bytes without parsing them again
    (a matrix over eight releases runs each transform once per distinct file), and without
    importing the transform file when what it defines is kept too (``listed``)."""
    py_file = Path(os.path.abspath(py_file))
    try:
        listing, pure = listed(py_file, cache, timeout)
    except TransformLoadError as exc:
        return Outcome(Status.FAILED, Reason.ERROR, str(exc))
    outcome = _run_listed(py_file, root, version, cache, timeout, listing, pure)
    if outcome is None:   # the kept listing is not what the file defines: made again
        memo.drop(cache, LISTINGS, memo.listing_key(py_file))
        progress.detail(f"dropped the kept listing of {py_file}: it does not match the "
                        "classes the file defines; it is made again")
        try:
            listing, pure = listed(py_file, None, timeout)
        except TransformLoadError as exc:
            return Outcome(Status.FAILED, Reason.ERROR, str(exc))
        outcome = _run_listed(py_file, root, version, cache, timeout, listing, pure)
    assert outcome is not None   # a listing just made is what the file defines
    return outcome


def _run_listed(py_file: Path, root: Path, version: Version | None, cache: Path | None,
                timeout: float, listing: list[tuple[str, str]], pure: bool) -> Outcome | None:
    """:func:`run_transform_file` once the file's listing is had; None when the worker finds
    that the file's classes are not the ones ``listing`` names."""
    files = list(dict.fromkeys(path for _name, path in listing))
    inputs: dict[str, str | None] = {}
    for name, path in listing:
        try:
            target = paths.safe_join(root, path)
        except paths.UnsafePathError as exc:
            return Outcome(Status.FAILED, Reason.UNSAFE_PATH, f"{name}: {exc}", files)
        if path not in inputs:
            inputs[path] = target.read_text(encoding="utf-8") if target.is_file() else None
    key = memo.key(py_file, inputs, version) if pure else None
    kept = memo.get(cache, key) if key else None
    if kept is None:
        try:
            done = _worked(_run_job, py_file, timeout, str(py_file), listing, inputs, version)
        except TransformLoadError as exc:
            return Outcome(Status.FAILED, Reason.ERROR, str(exc), files)
        if done is None:
            return None
        outcome, pending = done
        if key and (outcome.status is not Status.FAILED
                    or outcome.reason in (Reason.ANCHOR_MISSING, Reason.AMBIGUOUS_ANCHOR)):
            memo.put(cache, key, outcome, pending)   # the author's exceptions are not kept
    else:
        outcome, pending = kept
        outcome.wrote_only_files = True   # nothing of the author's ran this time
    outcome.files = files
    for rel, text in pending.items():
        paths.safe_join(root, rel).write_text(text, encoding="utf-8")
    return outcome


LISTINGS = "transform-listings"
#: the process the author's code runs in (forked on first use, kept for the run)
WORKER = process.Worker()


def _worked(job, py_file: Path, timeout: float, *args):
    """``job(*args)`` run in the transform worker: its value, or TransformLoadError for what
    the file could not do (including running past ``timeout`` seconds)."""
    try:
        answer = WORKER.call(job, *args, timeout=timeout)
    except process.WorkerError as exc:
        said = str(exc).replace(" and was stopped", " (--timeout) and was stopped") \
            if exc.overdue else str(exc)
        raise TransformLoadError(py_file, f"transform {said}") from None
    if isinstance(answer, TransformLoadError):
        raise answer
    return answer


def _run_job(py_file: str, listing: list[tuple[str, str]], inputs: dict[str, str | None],
             version: Version | None) -> tuple[Outcome, dict[str, str]] | TransformLoadError | None:
    """In the worker: what the classes of ``py_file`` make of ``inputs``; None when they are
    not the classes ``listing`` names (a kept listing that is wrong)."""
    try:
        classes = _loaded(Path(py_file))
    except TransformLoadError as exc:
        return exc
    if [(cls.__name__, cls.path) for cls in classes] != [tuple(x) for x in listing]:
        return None
    return _transformed(classes, inputs, version)


def _list_job(py_file: str) -> tuple[list[tuple[str, str]], bool] | TransformLoadError:
    """In the worker: ``(class name, path)`` of each class of ``py_file``, and whether all
    are pure."""
    try:
        classes = _loaded(Path(py_file))
    except TransformLoadError as exc:
        return exc
    return [(cls.__name__, cls.path) for cls in classes], all(cls.pure for cls in classes)


def _compile_job(py_file: str) -> str | TransformLoadError:
    """In the worker: the classes of ``py_file``, each with a path it may write, as
    ``TransformKind.compile`` says them."""
    try:
        classes = _loaded(Path(py_file))
        for cls in classes:
            try:
                paths.check_relative(cls.path)
            except paths.UnsafePathError as exc:
                raise TransformLoadError(Path(py_file), f"{cls.__name__}.path: {exc}",
                                         _class_line(cls)) from None
    except TransformLoadError as exc:
        return exc
    names = ", ".join(cls.__name__ for cls in classes)
    return f"{len(classes)} Transform class{'es' if len(classes) != 1 else ''} ({names})"


def _loaded(py_file: Path) -> list[type[Transform]]:
    """In the worker: the classes of ``py_file``, imported once per content of the file and
    its siblings (``memo.listing_key``)."""
    key = memo.listing_key(py_file)
    if key not in _imported:
        if len(_imported) >= 64:
            del _imported[next(iter(_imported))]
        _imported[key] = load_transforms(py_file)
    return _imported[key]


_imported: dict[str, list[type[Transform]]] = {}


def _listing(data: list) -> list[tuple[str, str]]:
    """A kept listing as ``listed`` gives it; TypeError or ValueError for another shape."""
    listing = [(name, path) for name, path in data]
    if not listing or not all(isinstance(x, str) for pair in listing for x in pair):
        raise TypeError("not a list of (class name, path)")
    return listing


def listed(py_file: Path, cache: Path | None = None, timeout: float = DEFAULT_TIMEOUT
           ) -> tuple[list[tuple[str, str]], bool]:
    """What ``py_file`` defines: ``(class name, path)`` of each Transform class in running
    order, and whether every one is ``pure``.  The listing of a file whose classes are all
    pure is kept by content (``memo.listing_key``); TransformLoadError when the file must be
    imported and cannot be."""
    py_file = Path(os.path.abspath(py_file))
    key = memo.listing_key(py_file)
    listing = memo.kept(cache, LISTINGS, key, _listing)
    if listing:
        return listing, True
    listing, pure = _worked(_list_job, py_file, timeout, str(py_file))
    if pure:
        memo.keep(cache, LISTINGS, key, listing)
    return listing, pure


def _transformed(classes: Sequence[type[Transform]], inputs: dict[str, str | None],
                 version: Version | None) -> tuple[Outcome, dict[str, str]]:
    """The outcome of the classes in turn on ``inputs`` (path -> text, None: no such file),
    and the new texts to write (none unless every class succeeded)."""
    pending: dict[str, str] = {}  # path -> new text, written only when every class succeeded
    upstream = 0
    for cls in classes:
        source = pending.get(cls.path, inputs[cls.path])
        if source is None:
            return Outcome(Status.FAILED, Reason.ANCHOR_MISSING,
                           f"{cls.__name__}: {cls.path} does not exist"), {}
        outcome = _run_one(cls, source, version)
        if isinstance(outcome, Outcome):
            return outcome, {}
        if outcome is None:
            upstream += 1
        else:
            pending[cls.path] = outcome
    if upstream == len(classes):
        return Outcome(Status.UPSTREAM, None, "postcondition already holds"), {}
    return Outcome(Status.APPLIED, None, ""), pending


def _read(cls: type[Transform], text: str):
    """``cls.read(text)``, once per text for the classes that read files patchkit's way: the
    transforms of a release that edit one file share its parse (libcst's nodes and a Span
    never change; a transform returns new ones).  A class with its own ``read`` reads alone."""
    how = getattr(cls.read, "__func__", None)
    if how not in _OWN_READS:
        return cls.read(text)
    key = (how, text)
    if key not in _parses:
        if len(_parses) >= 16:
            del _parses[next(iter(_parses))]
        _parses[key] = cls.read(text)
    return _parses[key]


_parses: dict[tuple[object, str], object] = {}
_OWN_READS = (Transform.read.__func__, CxxTransform.read.__func__)  # type: ignore[attr-defined]


def _run_one(cls: type[Transform], source: str, version: Version | None
             ) -> str | None | Outcome:
    """New text, ``None`` when already applied, or a failed outcome."""
    label = f"{cls.__name__} ({cls.path})"
    try:
        before = _read(cls, source)
    except ReadError as exc:
        return Outcome(Status.FAILED, Reason.ERROR, f"{label}: cannot parse: {exc}")
    instance = cls(version)
    try:
        if instance.postcondition(before):
            return None
        after = instance.transform(before)
    except AnchorError as exc:
        return Outcome(Status.FAILED, exc.reason, f"{label}: {exc}")
    except _STOPS:
        raise
    except BaseException as exc:  # noqa: BLE001  # the author's code; sys.exit() ends no run
        return Outcome(Status.FAILED, Reason.ERROR, f"{label}: {_said(exc)}")
    text = cls.written(after)
    if text is None:
        return Outcome(Status.FAILED, Reason.ERROR, f"{label}: transform() returned "
                                f"{type(after).__name__}, not {cls.result_type}")
    if text == source:
        return Outcome(Status.FAILED, Reason.ERROR,
                                f"{label}: transform changed nothing and the postcondition "
                                "does not hold")
    try:
        cls.check_result(source, text)
        reparsed = _read(cls, text)
    except ReadError as exc:
        return Outcome(Status.FAILED, Reason.ERROR, f"{label}: result does not compile: {exc}")
    try:
        holds = instance.postcondition(reparsed)
    except _STOPS:
        raise
    except BaseException as exc:  # noqa: BLE001
        return Outcome(Status.FAILED, Reason.ERROR, f"{label}: {_said(exc)}")
    if not holds:
        return Outcome(Status.FAILED, Reason.ERROR,
                                f"{label}: postcondition does not hold after the transform")
    return text


class TransformKind:
    name = "transform"
    is_folder = False
    replaces_files = False
    # A transform is the author's code and may write anywhere in the tree: the engine checks
    # that it wrote only what it names.
    writes_only_named = False

    def check(self, full: Path, rel: str) -> str | None:
        if full.suffix != ".py":
            return f"{rel} is not a Python file (.py)"
        return None

    def sources(self, full: Path, rel: str) -> list[str]:
        return [rel]

    def touched(self, full: Path) -> list[str]:
        try:
            return [path for _name, path in listed(full)[0]]
        except TransformLoadError as exc:
            raise KindError(str(exc)) from None

    def compile(self, full: Path, rel: str) -> str:
        """Compiled, imported, and each ``Transform`` class found with a path it may write."""
        try:
            compile(full.read_bytes(), str(full), "exec", dont_inherit=True)
        except SyntaxError as exc:   # IndentationError and TabError are SyntaxErrors
            raise KindError(f"{type(exc).__name__}: {exc.msg}", exc.lineno) from None
        except (ValueError, OSError) as exc:   # null bytes; unreadable
            raise KindError(str(exc), 1) from None
        try:
            return _worked(_compile_job, full, DEFAULT_TIMEOUT, str(Path(os.path.abspath(full))))
        except TransformLoadError as exc:
            raise KindError(exc.detail, exc.line) from None

    def apply(self, patch, full: Path, target: Target) -> Outcome:
        return run_transform_file(full, target.root,
                                  Version(target.version) if target.version else None,
                                  target.memo, target.timeout)

    def apply_together(self, fulls, target: Target) -> None:
        return None  # each on its own

    def refresh(self, patch, full: Path, tree: Path, result: PatchResult) -> str | None:
        return None  # a transform finds its anchors wherever they moved

    def changes(self, full: Path) -> frozenset[tuple[str, ...]]:
        return frozenset()   # what a transform writes is known only on a tree

    def remains(self, full: Path, read: Reader, version: str | None) -> Remains:
        """Each Transform class's file gone, or its anchor not found there."""
        try:
            classes = load_transforms(full)
        except TransformLoadError as exc:
            return Remains(still=(f"the transform cannot be loaded to prove it: {exc}",))
        still: list[str] = []
        gone: list[str] = []
        for cls in classes:
            data = read(cls.path)
            if data is None:
                gone.append(f"{cls.path} is gone")
                continue
            outcome = _run_one(cls, data.decode("utf-8", "replace"),
                               Version(version) if version else None)
            if isinstance(outcome, Outcome) and outcome.reason is Reason.ANCHOR_MISSING:
                gone.append(f"{cls.path}: {outcome.message.split(': ', 1)[-1]}")
            elif outcome is None:
                still.append(f"{cls.path} still has what {cls.__name__} changes (its "
                             "postcondition holds there)")
            elif isinstance(outcome, Outcome):
                still.append(f"{cls.path}: {outcome.message}")
            else:
                still.append(f"{cls.path} still has {cls.__name__}'s anchor (it applies there)")
        return Remains(tuple(still), tuple(gone))

    def stop(self, rebase: Rebase, patch, result: PatchResult, head: str) -> Stop:
        shown = rebase.shown
        what = {Reason.ANCHOR_MISSING: "its anchor is not in the file any more",
                Reason.AMBIGUOUS_ANCHOR: "its anchor matches more than one place now"}.get(
                    result.reason, "it fails on the new code")
        files = ", ".join(f"{shown}/{f}" for f in result.files) or shown
        lines = [head, "",
                 (f"The checkout {shown} holds {rebase.label} {rebase.to} with the patches "
                  f"before {patch.id} (left unchanged)."),
                 f"Change {patch.path}: {what}.  Match its anchors against {files}, then",
                 f"`patchkit rebase --continue` runs {patch.path} again and goes on.", ABORT]
        return Stop(patch.id, self.name, result.reason or Reason.ERROR, result.message,
                    [patch.path], lines)

    def resume(self, rebase: Rebase, patch, stop: Stop) -> None:
        dirty_resume(rebase, patch)


KIND = TransformKind()
