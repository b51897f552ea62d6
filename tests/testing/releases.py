"""The releases the patchset tests run on, and what the series does on each: every test takes
its expectation from the release it runs on, never from the tree it reads, so a release that
lost a patch fails instead of passing down another branch."""

from __future__ import annotations

from patchkit import versions

RELEASES = ("v0.27.1", "v0.28.0", "v0.29.0", "v0.30.0", "v0.31.0", "v0.32.0", "v0.33.0")

# patch id -> applied | upstream | skipped (out of the patch's vllm range)
V027 = {
    "draft-quant-normalization": "applied",
    "dspark-draft-quant-scope": "applied",
    "nvfp4-ds-mla-stage-a": "applied",
    "nvfp4-ds-mla-stage-b": "applied",
    "nvfp4-ds-mla-stage-b-v031": "skipped",
    "nvfp4-ds-mla-stage-c": "applied",
    "nvfp4-ds-mla-stage-c-v028": "skipped",
    "nvfp4-ds-mla-stage-c-v029": "skipped",
    "nvfp4-ds-mla-stage-c-v030": "skipped",
    "nvfp4-ds-mla-stage-c-v031": "skipped",
    "dspark-loader-guards": "applied",
    "dspark-draft-moe-backend": "applied",
    # DeepSeek-V4.1 (vllm/models/deepseek_v41) from 0.30.0
    "dspark-v41-draft-quant-scope": "skipped",
    "dspark-v41-loader-guards": "skipped",
}
# stage A follows the startswith("nvfp4") tests; stage C has a sibling per release
V028 = dict(V027, **{"nvfp4-ds-mla-stage-c": "skipped", "nvfp4-ds-mla-stage-c-v028": "applied"})
V029 = dict(V027, **{"nvfp4-ds-mla-stage-c": "skipped", "nvfp4-ds-mla-stage-c-v029": "applied"})
# stage A is upstream from 0.30.0; B uses its >=0.30 variant (the 0.31 resolver is in 0.30);
# DeepSeek-V4.1 (vllm/models/deepseek_v41) is there from 0.30.0
V030 = dict(V027, **{"nvfp4-ds-mla-stage-a": "upstream", "nvfp4-ds-mla-stage-b": "skipped",
                     "nvfp4-ds-mla-stage-b-v031": "applied", "nvfp4-ds-mla-stage-c": "skipped",
                     "nvfp4-ds-mla-stage-c-v030": "applied",
                     "dspark-v41-draft-quant-scope": "applied",
                     "dspark-v41-loader-guards": "applied"})
# C uses its >=0.31 variant
V031 = dict(V030, **{"nvfp4-ds-mla-stage-c-v030": "skipped",
                     "nvfp4-ds-mla-stage-c-v031": "applied"})
# the pin: stage A is out of its range at 0.33.0
V033 = dict(V031, **{"nvfp4-ds-mla-stage-a": "skipped"})
STATUSES = {"v0.27.1": V027, "v0.28.0": V028, "v0.29.0": V029, "v0.30.0": V030,
            "v0.31.0": V031, "v0.32.0": V031, "v0.33.0": V033}


def since(release: str, first: str) -> bool:
    """Whether ``release`` is ``first`` or a later one."""
    return versions.parse(release.removeprefix("v")) >= versions.parse(first.removeprefix("v"))
