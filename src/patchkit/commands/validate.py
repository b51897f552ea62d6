"""``patchkit validate``: the manifest and the files it names, and nothing else."""

from __future__ import annotations

from pathlib import Path

from patchkit import manifest


def run(manifest_path: Path) -> manifest.Manifest:
    return manifest.load(manifest_path)
