"""Text for ``images`` (each node's builds, newest first, then the drift line), ``images
--prune`` (what each node removed and kept, and the bytes freed) and ``rollback`` (a line per
node)."""

from __future__ import annotations

from patchkit.packageid import VLLM
from patchkit.render.progress import size


NO_TIME = "reproducible (no build time)"


def commit(revision: str | None) -> str:
    """A patchset commit as a line shows it: 12 hex, and its -dirty mark."""
    if not revision:
        return "unknown (built outside a git repository, or before patchkit said)"
    sha, dash, mark = revision.partition("-")
    return sha[:12] + dash + mark


def pairings(data: dict) -> list[str]:
    """One line per address that shares an engine ID with another: merged, or kept apart."""
    return [(f"merged    {p['address']} into {p['into']}: {p['reason']}" if p["merged"] else
             f"apart     {p['address']} and {p['into']}: {p['reason']}")
            for p in data.get("same_engine_id", [])]


def listing(report) -> str:
    data = report.to_dict()
    lines: list[str] = pairings(data)
    for node in data["nodes"]:
        if not node["ok"]:
            lines.append(f"{node['node']}: unreachable: {node['error']}")
            continue
        lines.append(f"{node['node']}: {len(node['images'])} build(s) of {data['patchset']}, "
                     "newest first")
        for image in node["images"]:
            lines += _build_lines(image)
    if data["drift"]:
        lines.append("drift: " + "; ".join(
            f"{d['tag']} names " + ", ".join(f"{held or 'nothing'} on {node}"
                                             for node, held in d["nodes"].items())
            for d in data["drift"]))
    return "\n".join(lines)


def _build_lines(image: dict) -> list[str]:
    mark = "*" if image["current"] else " "
    name = image["immutable_tag"] or "(no immutable tag)"
    head = f"  {mark} {name}  {image['id'][:19]}"
    if image["moving_tags"]:
        head += f"  current: {', '.join(image['moving_tags'])}"
    others = dict(image["packages"])
    others.pop(VLLM.name, None)   # told first, as vLLM
    packages = ", ".join(f"{k} {v}" for k, v in sorted(others.items()) if v)
    info = (f"      vLLM {image['vllm'] or '?'}" + (f" ({packages})" if packages else "")
            + f"; created {image['created'] or NO_TIME}; on this node since {image['got']}")
    lines = [head, info, f"      patchset commit {commit(image.get('commit'))}; patches: "
                         f"{', '.join(image['patches']) or 'none'}"]
    if image["other_tags"]:
        lines.append(f"      other tags: {', '.join(image['other_tags'])}")
    return lines


def pruned(report) -> str:
    data = report.to_dict()
    verb = "would remove" if data["dry_run"] else "removed"
    lines: list[str] = pairings(data)
    for node in data["nodes"]:
        where = node["node"]
        if not node["ok"]:
            lines.append(f"failed    {where}: {node['error']}")
        for r in node["removed"]:
            lines.append(f"{verb} {where}: {r['tag']} ({size(r['bytes'])})")
        for k in node["kept"]:
            lines.append(f"kept      {where}: {k['tag']}: {k['why']}")
        if node["ok"]:
            lines.append(f"{where}: {verb} {len(node['removed'])} build(s), "
                         f"{size(node['bytes_freed'])} freed")
    return "\n".join(lines)


def rollback(report) -> str:
    data = report.to_dict()
    lines = pairings(data)
    for node in data["nodes"]:
        status = node["status"]
        if status == "failed":
            lines.append(f"failed    {node['node']}: {node['error']}")
            continue
        word = status if not data["dry_run"] or status == "already" else f"would-be {status}"
        how = {"already": f"{data['moving_tag']} names {data['to']} already",
               "moved": f"{data['moving_tag']} -> {data['to']} (was {node['was'] or 'nothing'}); "
                        "held there, nothing sent",
               "copied": f"{data['moving_tag']} -> {data['to']} (was {node['was'] or 'nothing'})"
               }[status]
        if status == "copied":
            sent = node.get("sent")
            how += (f"; {sent['bytes']:,} bytes sent ({sent['layers']} layer(s), "
                    f"{sent['layers_skipped']} held there left out)" if sent else
                    "; the layers it lacks to send")
        lines.append(f"{word:<9} {node['node']}: {how}")
    return "\n".join(lines)
