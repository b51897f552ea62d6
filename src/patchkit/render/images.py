"""Text for ``images`` (each node's builds, newest first, then the drift line), ``images
--prune`` (what each node removed and kept, and the bytes freed) and ``rollback`` (a line per
node)."""

from __future__ import annotations

from patchkit.commands.rollback import NodeStatus
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
    lines += evidence_problems(report)
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
    lines.append(f"      evidence: {last_evidence(image['last_evidence'])}"
                 + (f" ({len(image['evidence'])} records)" if len(image["evidence"]) > 1 else ""))
    return lines


def last_evidence(record: dict | None) -> str:
    """One record in a few words: the verdict, tok/s, acceptance, when and where."""
    if record is None:
        return "never served"
    figures = record.get("figures") or {}
    acceptance = record.get("acceptance")
    if acceptance is None:
        acceptance = figures.get("acceptance")
    parts = [f"{record['kind']} {record['verdict']}"]
    if figures.get("decode_tok_s") is not None:
        parts.append(f"{figures['decode_tok_s']:.1f} tok/s")
    if acceptance is not None:
        parts.append(f"acceptance {acceptance:.2f}")
    return ", ".join(parts) + f", {record['time']} on {record['node']}"


def evidence(report) -> str:
    """``images --evidence TAG``: a line per record, oldest first, then the problems."""
    data = report.to_dict()
    lines = [f"{data['build']} ({(data['image_id'] or '?')[:19]}): "
             f"{len(data['records'])} record(s), oldest first"]
    for r in data["records"]:
        lines.append(f"  {last_evidence(r)}")
        s, f = r.get("settings"), r.get("figures") or {}
        if s:
            more = (f"; first token {f['ttft_s'] * 1000:.0f} ms" if f.get("ttft_s") is not None
                    else "")
            if f.get("aggregate_tok_s") is not None:
                more += f"; {f['aggregate_tok_s']:.1f} tok/s aggregate at {s['concurrency']}"
            lines.append(f"      model {s['model']}, {s['requests']} request(s) of "
                         f"{s['output_tokens']} tokens; vLLM {r.get('server_version') or '?'}; "
                         f"spec decode {_onoff(r.get('spec_decode'))}{more}")
        failed = [v for v in r["verdicts"] if v["status"] not in ("ok",)]
        for v in failed:
            lines.append(f"      {v['status']}: {v['name']}: {v['message']}")
    lines += [f"skipped: {p}" for p in data["problems"]]
    return "\n".join(lines)


def _onoff(value) -> str:
    return {True: "on", False: "off"}.get(value, "unknown")


def evidence_problems(report) -> list[str]:
    return [f"skipped: {p}" for p in report.to_dict().get("evidence_problems") or ()]


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
    lines += [f"passed over {p}" for p in data.get("passed_over") or ()]
    if data.get("why"):
        lines.append(f"{'would roll' if data['dry_run'] else 'rolling'} {data['moving_tag']} "
                     f"back to {data['to']}: {data['why']}")
    for node in data["nodes"]:
        status = NodeStatus(node["status"])
        if status is NodeStatus.FAILED:
            lines.append(f"failed    {node['node']}: {node['error']}")
            continue
        word = (status.value if not data["dry_run"] or status is NodeStatus.ALREADY
                else f"would-be {status.value}")
        how = {NodeStatus.ALREADY: f"{data['moving_tag']} names {data['to']} already",
               NodeStatus.MOVED: f"{data['moving_tag']} -> {data['to']} "
                                 f"(was {node['was'] or 'nothing'}); held there, nothing sent",
               NodeStatus.COPIED: f"{data['moving_tag']} -> {data['to']} "
                                  f"(was {node['was'] or 'nothing'})"
               }[status]
        if status is NodeStatus.COPIED:
            sent = node.get("sent")
            how += (f"; {sent['bytes']:,} bytes sent ({sent['layers']} layer(s), "
                    f"{sent['layers_skipped']} held there left out)" if sent else
                    "; the layers it lacks to send")
        lines.append(f"{word:<9} {node['node']}: {how}")
    return "\n".join(lines)
