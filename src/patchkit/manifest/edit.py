"""Edits to patchset.yaml that touch only the characters that must change.

``rebase`` moves the pin and marks or drops patches; ``export`` adds entries.  Both go through
:class:`ManifestText`, which finds a node by its path (``("vllm", "ref")``, ``("patches", 2,
"vllm")``) in the composed YAML and splices new text into exactly that node's span.  Comments,
blank lines, key order and quoting of everything else survive byte for byte.  Every edit
re-composes the text, so a chain of edits never works from stale positions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from patchkit.errors import ManifestError
from patchkit.files import write_if_changed

Key = str | int


class ManifestText:
    """The text of a manifest and the line-preserving edits made to it."""

    def __init__(self, text: str, name: str = "patchset.yaml") -> None:
        self.text = text
        self.name = name

    @classmethod
    def read(cls, path: Path) -> ManifestText:
        return cls(path.read_text(encoding="utf-8"), path.name)

    def write(self, path: Path) -> bool:
        """Write atomically; False (and nothing written) when the bytes would not change."""
        return write_if_changed(path, self.text.encode("utf-8"))

    # -- finding nodes -------------------------------------------------------------------------

    def _root(self) -> yaml.Node:
        try:
            node = yaml.compose(self.text, Loader=yaml.SafeLoader)
        except yaml.YAMLError as exc:
            raise ManifestError(f"cannot edit: YAML syntax error: {exc}", path=self.name) from None
        if node is None:
            raise ManifestError("cannot edit: the manifest is empty", path=self.name)
        return node

    def _find(self, path: Sequence[Key]) -> tuple[yaml.Node | None, yaml.Node]:
        """The key node (None for a sequence item) and value node at ``path``."""
        node: yaml.Node = self._root()
        key_node: yaml.Node | None = None
        for step in path:
            if isinstance(step, int):
                if not isinstance(node, yaml.SequenceNode) or step >= len(node.value):
                    raise KeyError(path)
                key_node, node = None, node.value[step]
                continue
            if not isinstance(node, yaml.MappingNode):
                raise KeyError(path)
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value == step:
                    key_node, node = k, v
                    break
            else:
                raise KeyError(path)
        return key_node, node

    def has(self, path: Sequence[Key]) -> bool:
        try:
            self._find(path)
        except KeyError:
            return False
        return True

    def value(self, path: Sequence[Key]) -> str | None:
        """The string at ``path`` as YAML reads it, or None when it is not a scalar."""
        _, node = self._find(path)
        return node.value if isinstance(node, yaml.ScalarNode) else None

    # -- edits ---------------------------------------------------------------------------------

    def set_scalar(self, path: Sequence[Key], value: str) -> None:
        """Replace the scalar at ``path``, keeping its quoting where the new value allows."""
        _, node = self._find(path)
        if not isinstance(node, yaml.ScalarNode):
            raise ManifestError(f"cannot edit {_dotted(path)}: it is not a single value",
                                path=self.name, line=node.start_mark.line + 1)
        start, end = node.start_mark.index, node.end_mark.index
        old = self.text[start:end]
        style = node.style if node.style in ("'", '"') else None
        new = scalar(value, style)
        if node.style in ("|", ">") and old.endswith("\n"):
            new += "\n"  # a block scalar's span runs through its last line break
        self.text = self.text[:start] + new + self.text[end:]

    def insert_key(self, path: Sequence[Key], key: str, value: str | Mapping[str, str],
                   after: str | None = None, style: str | None = None) -> None:
        """Add ``key: value`` to the block mapping at ``path``, on a new line after the line of
        key ``after`` (default: the mapping's last key).  A mapping value becomes a nested
        block; ``style`` is as for :func:`scalar`."""
        _, node = self._find(path)
        if not isinstance(node, yaml.MappingNode) or node.flow_style or not node.value:
            raise ManifestError(f"cannot add {key!r} to {_dotted(path) or 'the manifest'}: "
                                "not a block mapping", path=self.name,
                                line=node.start_mark.line + 1)
        pairs = node.value
        anchor = pairs[-1]
        if after is not None:
            for k, v in pairs:
                if k.value == after:
                    anchor = (k, v)
                    break
        indent = anchor[0].start_mark.column
        last = _last_line(anchor[1])
        lines = [f"{' ' * indent}{key}:" + ("" if isinstance(value, Mapping)
                                            else f" {scalar(value, style)}")]
        if isinstance(value, Mapping):
            for k, v in value.items():
                lines.append(f"{' ' * (indent + 2)}{scalar(k)}: {scalar(v)}")
        self._insert_lines(last + 1, lines)

    def delete_item(self, path: Sequence[Key], index: int, comment: str | None = None) -> None:
        """Delete item ``index`` of the block sequence at ``path``: its lines, from its dash to
        its last value.  Comments above and below it stay (they may head a section).  With
        ``comment``, a comment line at the dash's indent takes the item's place."""
        _, node = self._find(path)
        if not isinstance(node, yaml.SequenceNode) or node.flow_style:
            raise ManifestError(f"cannot edit {_dotted(path)}: not a block list", path=self.name)
        item = node.value[index]
        first, last = item.start_mark.line, _last_line(item)
        lines = self.text.splitlines(keepends=True)
        if first > 0 and lines[first - 1].strip() == "-":  # the dash alone on the line above
            first -= 1
        if comment is not None:
            dash = len(lines[first]) - len(lines[first].lstrip(" "))
            lines[first:last + 1] = [" " * dash + "# " + " ".join(comment.split()) + "\n"]
            self.text = "".join(lines)
            return
        before_blank = first > 0 and not lines[first - 1].strip()
        at_end = last + 1 >= len(lines)
        if before_blank and (at_end or not lines[last + 1].strip()):
            # one blank line separated it from its neighbours: keep one, or none at the end
            if at_end:
                first -= 1
            else:
                last += 1
        del lines[first:last + 1]
        self.text = "".join(lines)

    def append_item(self, path: Sequence[Key], entry: Sequence[tuple[str, str]]) -> None:
        """Append a mapping ``entry`` (ordered key, value pairs) to the block sequence at
        ``path``, creating the sequence when the key is absent or empty.  Indentation follows
        the existing items."""
        self.append_items(path, [entry])

    def append_items(self, path: Sequence[Key],
                     entries: Sequence[Sequence[tuple[str, str]]]) -> None:
        """``append_item`` for each of ``entries``, in order, reading the manifest once (a
        split import appends dozens)."""
        dash, keys = 2, 4
        try:
            key_node, node = self._find(path)
        except KeyError:
            key_node, node = None, None
        if node is not None and isinstance(node, yaml.SequenceNode) and node.value:
            if node.flow_style:
                raise ManifestError(f"cannot append to {_dotted(path)}: it is a flow-style "
                                    "[...] list", path=self.name, line=node.start_mark.line + 1)
            first = node.value[0]
            line_text = self.text.splitlines()[first.start_mark.line]
            dash = line_text.index("-")
            keys = first.start_mark.column
            at = _last_line(node.value[-1]) + 1
        elif node is not None and _is_empty(node):
            assert key_node is not None
            indent = key_node.start_mark.column
            dash, keys = indent + 2, indent + 4
            # `patches:` or `patches: []`: the new block starts on the next line
            start, end = key_node.end_mark.index, node.end_mark.index
            head = self.text[:start] + ":"
            rest = self.text[end:]
            tail = rest.split("\n", 1)
            comment = tail[0] if tail[0].strip().startswith("#") else ""
            self.text = head + comment + "\n" + (tail[1] if len(tail) > 1 else "")
            at = key_node.start_mark.line + 1
        elif node is None and len(path) == 1:
            if self.text and not self.text.endswith("\n"):
                self.text += "\n"
            self.text += f"{path[0]}:\n"
            at = len(self.text.splitlines())
        else:
            raise ManifestError(f"cannot append to {_dotted(path)}: not a list", path=self.name)
        lines = []
        for entry in entries:
            for n, (k, v) in enumerate(entry):
                prefix = " " * dash + "- " + " " * (keys - dash - 2) if n == 0 else " " * keys
                lines.append(f"{prefix}{k}: {scalar(v)}")
        self._insert_lines(at, lines)

    def _insert_lines(self, at: int, new: Sequence[str]) -> None:
        lines = self.text.splitlines(keepends=True)
        if at > 0 and at <= len(lines) and not lines[at - 1].endswith("\n"):
            lines[at - 1] += "\n"
        lines[at:at] = [line + "\n" for line in new]
        self.text = "".join(lines)


def _is_empty(node: yaml.Node) -> bool:
    if isinstance(node, yaml.ScalarNode):
        return node.tag == "tag:yaml.org,2002:null"
    return isinstance(node, yaml.SequenceNode) and not node.value


def _last_line(node: yaml.Node) -> int:
    """The 0-based line holding the last character of ``node``'s content.  End marks of block
    collections sit at the next token, past trailing comments, so they are not used."""
    if isinstance(node, yaml.ScalarNode):
        end = node.end_mark
        if node.style in ("|", ">") or end.column == 0:
            return max(end.line - 1, node.start_mark.line)
        return end.line
    children: list[yaml.Node] = []
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            children += [k, v]
    elif isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    if not children:
        return node.end_mark.line if node.flow_style else node.start_mark.line
    if getattr(node, "flow_style", False):
        return node.end_mark.line
    return max(_last_line(c) for c in children)


def _dotted(path: Sequence[Key]) -> str:
    out = ""
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else step)
    return out


def scalar(value: str, style: str | None = None) -> str:
    """``value`` as YAML text: in ``style`` (``'`` or ``"``) when given, else plain when that
    reads back as the same string, else double-quoted."""
    if style == "'" and "\n" not in value:
        return "'" + value.replace("'", "''") + "'"
    if style == '"':
        return json.dumps(value, ensure_ascii=False)
    if _plain_ok(value):
        return value
    return json.dumps(value, ensure_ascii=False)


def _plain_ok(value: str) -> bool:
    if not value or value != value.strip() or "\n" in value or " #" in value or ": " in value:
        return False
    try:
        return yaml.safe_load(f"k: {value}\n") == {"k": value}
    except yaml.YAMLError:
        return False
