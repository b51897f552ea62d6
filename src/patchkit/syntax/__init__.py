"""The syntax of the languages a patch's files are written in: one module each, chosen by the
file's suffix.  The manifest loader checks a ``verify:`` assertion's scope and predicate with it,
the transform kind finds a file's language with it, and the assertions are judged in it; it sits
below all three and uses nothing but ``errors``.

A language is a value of the :class:`Language` shape (``base.py``); the assertion engine and the
manifest loader look it up with :func:`for_file` and never ask which one it is.  What differs
between Python and C++ (how ``in:`` is spelled, which predicates apply, how a file parses, how a
scope is found and searched) is the language's to say.  A language module is imported only when
a file of its kind is met, so a Python-only series never loads a tree-sitter grammar.
"""

from __future__ import annotations

import importlib
from pathlib import PurePosixPath

from patchkit.syntax.base import GrammarError, Language, Scope, Search, Unusable

# suffix -> (module, attribute).  `.h` is read as C++: the headers of the projects patchkit
# patches (FlashInfer, vLLM, CUTLASS) are C++, and C++'s grammar reads most C headers too.
TABLE: dict[str, tuple[str, str]] = {
    ".py": ("patchkit.syntax.python", "PYTHON"),
    ".c": ("patchkit.syntax.cxx", "C"),
    ".h": ("patchkit.syntax.cxx", "CPP"),
    ".cc": ("patchkit.syntax.cxx", "CPP"),
    ".cpp": ("patchkit.syntax.cxx", "CPP"),
    ".hpp": ("patchkit.syntax.cxx", "CPP"),
    ".cu": ("patchkit.syntax.cxx", "CUDA"),
    ".cuh": ("patchkit.syntax.cxx", "CUDA"),
}
# A file of any other suffix is judged as Python, as it always was (a `.pyi`, a script).
DEFAULT = TABLE[".py"]

__all__ = ["DEFAULT", "TABLE", "GrammarError", "Language", "Scope", "Search", "Unusable",
           "for_file"]


def for_file(rel: str) -> Language:
    """The language a checkout file is judged in, by its suffix."""
    module, attr = TABLE.get(PurePosixPath(rel).suffix.lower(), DEFAULT)
    return getattr(importlib.import_module(module), attr)
