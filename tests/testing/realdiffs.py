"""Four diffs cut from the real vLLM v0.27.1 files, each with a known fate at v0.33.0:
``dtype-map`` upstream (v0.33.0 has the very line), ``dtype-size`` applied at an offset (the
function moved down), ``dtype-tail`` conflict (entries were added right after its anchor),
``chat-utils`` anchor missing (the file is gone)."""

from __future__ import annotations

from pathlib import Path

from testing.upstream import sh
from testing.upstream import unified as _unified

TORCH_UTILS = "vllm/utils/torch_utils.py"
CHAT_UTILS = "vllm/entrypoints/chat_utils.py"  # gone by v0.33.0


def unified(before: str, after: str, rel: str) -> str:
    assert before != after, rel
    return _unified(rel, before, after)


def _once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def real_diffs(repo: Path, tag: str) -> dict[str, str]:
    """id -> diff text, cut from ``tag`` (v0.27.1) of the PyPI upstream at ``repo``."""
    torch_utils = sh("git", "show", f"{tag}:{TORCH_UTILS}", cwd=repo) + "\n"
    chat_utils = sh("git", "show", f"{tag}:{CHAT_UTILS}", cwd=repo) + "\n"
    return {
        "dtype-map": unified(torch_utils, _once(
            torch_utils, '    "fp8_ds_mla": torch.uint8,\n',
            '    "fp8_ds_mla": torch.uint8,\n    "nvfp4_ds_mla": torch.uint8,\n'), TORCH_UTILS),
        "dtype-size": unified(torch_utils, _once(
            torch_utils, '    """Get the size of the data type in bytes."""\n',
            '    """Get the size of the data type in bytes (patched)."""\n'), TORCH_UTILS),
        "dtype-tail": unified(torch_utils, _once(
            torch_utils, '    "nvfp4": torch.uint8,\n}\n',
            '    "nvfp4": torch.uint8,\n    "nvfp4_tail": torch.uint8,\n}\n'), TORCH_UTILS),
        "chat-utils": unified(chat_utils, _once(
            chat_utils, "def _detect_field(\n", "def _detect_field(  # patched\n"), CHAT_UTILS),
    }
