"""``patchkit cache`` and ``cache prune`` as a person reads them (JSON is the results' own)."""

from __future__ import annotations

import time

from patchkit.commands.cache import Entry, Listing, Pruned
from patchkit.render.progress import size


def _row(e: Entry, root) -> str:
    used = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.used))
    return (f"  {e.kind.value:<10} {size(e.bytes):>9}  {used}  {'pinned ' if e.pinned else '       '}"
            f"{e.what}  ({e.path.relative_to(root)})")


def listing(found: Listing) -> str:
    pinned = f" (pinned: by {', '.join(map(str, found.manifests))})" if found.manifests else ""
    lines = [f"{found.cache}: {size(found.bytes)} in {len(found.entries)} entries{pinned}"]
    lines += [_row(e, found.cache) for e in found.entries]
    return "\n".join(lines)


def pruned(result: Pruned) -> str:
    verb = "would remove" if result.dry_run else "removed"
    lines = [f"{verb} {e.kind} {e.what} ({size(e.bytes)})" for e in result.removed]
    lines += [f"kept {e.kind} {e.what}: a run is using it" for e in result.busy]
    total = sum(e.bytes for e in result.removed)
    kept = (f" ({sum(e.pinned for e in result.kept)} pinned by "
            f"{', '.join(map(str, result.manifests))})" if result.manifests else "")
    lines.append(f"{verb} {len(result.removed)} entries, {size(total)}; kept "
                 f"{len(result.kept)}{kept}")
    return "\n".join(lines)
