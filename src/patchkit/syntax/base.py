"""The protocol every assertion language implements, and the values it hands the engine."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from patchkit.errors import UsageError

LISTED = 10  # names shown in a failure message before "... (N more)"


class GrammarError(UsageError):
    """A language's parser cannot be loaded (a tree-sitter grammar missing or broken)."""


@dataclass(frozen=True)
class Unusable:
    """A file that cannot be judged: absent, unreadable, or not parsing."""

    message: str
    line: int | None = None
    col: int | None = None


@dataclass(frozen=True)
class Scope:
    """Where an assertion is judged: the whole file, or the one definition ``in:`` names."""

    nodes: tuple[Any, ...]      # the language's own nodes
    label: str                  # "the module", "the file", or the scope as written
    line: int = 1
    col: int = 0
    trouble: str | None = None  # why the scope cannot be judged (syntax errors inside it)


@dataclass(frozen=True)
class Search:
    """What a predicate found in a scope."""

    hit_text: str | None        # how the hit reads, e.g. "self._verify_draft_quant_path"
    line: int | None            # where the hit is (None when nothing was hit)
    col: int | None
    seen: list[str] = field(default_factory=list)  # what was there instead, in source order

    @property
    def found(self) -> bool:
        return self.line is not None


class Language(Protocol):
    """One language assertions are judged in."""

    name: str                    # as messages name it: "Python", "C++", "CUDA"
    predicates: tuple[str, ...]  # the predicate words it judges ("not" aside)
    file_label: str              # the whole file as a scope: "the module", "the file"
    compiled: bool               # its files are compiled before they run (C, C++, CUDA)

    def ready(self) -> None:
        """Load the parser now: :class:`GrammarError` when it cannot be had."""

    def scope_problem(self, scope: str) -> str | None:
        """Why ``in: scope`` cannot name anything in this language, or None."""

    def value_problem(self, predicate: str, value: str) -> str | None:
        """Why ``value`` cannot be what ``predicate`` looks for, or None."""

    def parse(self, text: str, rel: str) -> Any:
        """The file's tree, or :class:`Unusable`; :class:`GrammarError` when the parser
        itself cannot be had."""

    def resolve(self, tree: Any, scope: str | None, near: Sequence[int] = ()
                ) -> Scope | tuple[Scope, str]:
        """The scope, or ``(deepest scope found, failure message)``.  ``near``: the lines the
        series changed in the file, where known, which a failure may point near."""

    def search(self, predicate: str, scope: Scope, value: str) -> Search:
        """The first hit of ``predicate`` for ``value`` inside ``scope``."""


def listing(items: Iterable[str]) -> str:
    unique = list(dict.fromkeys(items))
    if not unique:
        return "none"
    shown = ", ".join(unique[:LISTED])
    more = len(unique) - LISTED
    return f"{shown}, ... ({more} more)" if more > 0 else shown
