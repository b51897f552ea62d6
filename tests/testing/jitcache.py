"""FlashInfer's prebuilt-module distributions as pip installs them, site-relative: the 0.7
``flashinfer_jit_cache`` shim, a JIT-cache provider (its package under
``flashinfer_jit_cache/providers/<arch>``, a ``manifest.json``, ``jit_cache/<X>/<X>.so``, and a
dist-info with METADATA, INSTALLER, ``entry_points.txt`` in group
``flashinfer.jit_cache.providers`` and a RECORD of them all), and the ``flashinfer-cubin``
distribution.  The same files serve the unit tests (under a site of an in-memory image) and
the bases built for the engine tests."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json

GROUP = "flashinfer.jit_cache.providers"

# what a provider's entry point does, written here: its manifest, with the folder beside it
PROVIDER_INIT = b'''\
import json
import pathlib

_HERE = pathlib.Path(__file__).resolve().parent


def get_provider():
    data = json.loads((_HERE / "manifest.json").read_text())
    data["jit_cache_dir"] = str(_HERE / "jit_cache")
    return data
'''


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def installed_dist(name: str, version: str, files: dict[str, bytes],
                   entry_points: str | None = None) -> dict[str, bytes]:
    """``files`` with ``name``'s dist-info, as pip leaves a wheel: METADATA, INSTALLER, the
    entry points when given, and a RECORD of every file."""
    info = f"{name.replace('-', '_')}-{version}.dist-info"
    out = dict(files)
    out[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    out[f"{info}/INSTALLER"] = b"pip\n"
    if entry_points is not None:
        out[f"{info}/entry_points.txt"] = entry_points.encode()
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for path, data in sorted(out.items()):
        writer.writerow((path, _hash(data), str(len(data))))
    writer.writerow((f"{info}/RECORD", "", ""))
    out[f"{info}/RECORD"] = buf.getvalue().encode()
    return out


# what FlashInfer 0.7 asks of the shim at import (jit/env.py): its version, and the providers
# its entry point group lists, each as a value with the manifest's fields
SHIM_INIT = b'''\
from importlib import metadata
from types import SimpleNamespace

from ._build_meta import __version__

GROUP = "flashinfer.jit_cache.providers"


def get_jit_cache_providers():
    found = []
    for entry in metadata.entry_points(group=GROUP):
        manifest = entry.load()()
        found.append(SimpleNamespace(
            provider_id=manifest.get("provider_id", entry.name),
            distribution=manifest["distribution"], version=manifest["version"],
            jit_cache_dir=manifest["jit_cache_dir"],
            cuda_architectures=tuple(manifest["cuda_architectures"]),
            modules=tuple(manifest["modules"])))
    return found
'''


def shim(version: str) -> dict[str, bytes]:
    """The ``flashinfer-jit-cache`` shim of FlashInfer 0.7 (no modules of its own): its version
    and the providers its entry point group lists, as FlashInfer's import asks for them."""
    return installed_dist("flashinfer-jit-cache", version, {
        "flashinfer_jit_cache/__init__.py": SHIM_INIT,
        "flashinfer_jit_cache/_build_meta.py": f'__version__ = "{version}"\n'.encode()})


def provider(arch: str, modules: dict[str, bytes], version: str, *,
             manifest: bytes | None = None, archs: list[str] | None = None,
             listed: list[str] | None = None) -> dict[str, bytes]:
    """A provider distribution ``flashinfer-jit-cache-<arch>``: ``modules`` (name -> a shared
    object) under its ``jit_cache``; its manifest lists ``listed`` (default: the modules) for
    ``archs`` (default: ``arch``), unless ``manifest`` gives its bytes."""
    package = f"flashinfer_jit_cache/providers/{arch}"
    if manifest is None:
        manifest = json.dumps({
            "schema_version": 1, "provider_id": arch,
            "distribution": f"flashinfer-jit-cache-{arch}", "version": version,
            "cuda_architectures": archs or [arch],
            "modules": sorted(modules) if listed is None else listed}, indent=2).encode()
    files = {f"{package}/__init__.py": PROVIDER_INIT, f"{package}/manifest.json": manifest}
    files.update({f"{package}/jit_cache/{m}/{m}.so": data for m, data in modules.items()})
    entry = f"[{GROUP}]\n{arch} = flashinfer_jit_cache.providers.{arch}:get_provider\n"
    return installed_dist(f"flashinfer-jit-cache-{arch}", version, files, entry)


def cubin(version: str) -> dict[str, bytes]:
    """``flashinfer-cubin``: its cubins under ``flashinfer_cubin/cubins``."""
    return installed_dist("flashinfer-cubin", version, {
        "flashinfer_cubin/__init__.py": b"",
        "flashinfer_cubin/cubins/a/k.cubin": b"\0cubin"})


def flashinfer_subset(wheel, keep) -> dict[str, bytes]:
    """The files of a real ``flashinfer-python`` wheel that ``keep(path)`` takes, with its whole
    dist-info as pip leaves it (METADATA, its RECORD of every file plus INSTALLER): an install
    that a test base can hold whole where the release itself is too large (0.7.4 unpacks to
    700 MB, 390 MB of it CUDA sources no test compiles)."""
    import zipfile

    out: dict[str, bytes] = {}
    with zipfile.ZipFile(wheel) as zf:
        info = next(n.split("/")[0] for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        for name in zf.namelist():
            if name.endswith("/") or name == f"{info}/RECORD":
                continue
            if name.startswith(info + "/") or keep(name):
                out[name] = zf.read(name)
        rows = [r for r in csv.reader(io.StringIO(zf.read(f"{info}/RECORD").decode()))
                if r and r[0] != f"{info}/RECORD"]
    out[f"{info}/INSTALLER"] = b"pip\n"
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerows([*rows, (f"{info}/INSTALLER", _hash(b"pip\n"), "4"),
                      (f"{info}/RECORD", "", "")])
    out[f"{info}/RECORD"] = buf.getvalue().encode()
    return out
