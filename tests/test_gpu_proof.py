"""bench/gpu_proof, the speed gate's proof on a real GPU (docs/gpu-proof.md), checked where no
GPU is: its two manifests validate, its script parses and is shellcheck-clean, and the tiny
model it serves answers, greedily, in cycles of 40 different words (so smoke's chat check sees
no word over and over, and n-gram speculation has something to draft from).  The forward pass
below is the model's with the layers left out: their weights are 0.02-scale noise, far under
the margin the output head is built with (checked here too)."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys

import pytest
from testing import REPO_ROOT, patchkit

from patchkit.serving.garble import degenerate

PROOF = REPO_ROOT / "bench" / "gpu_proof"


@pytest.mark.parametrize("manifest,said", [
    ("patchset.yaml", "patchset.yaml: ok (1 patch, 1 diff parsed, 1 assertion, vLLM v0.26.0)"),
    ("as-is.yaml", "as-is.yaml: ok (0 patches, vLLM v0.26.0)"),
])
def test_the_proof_manifests_validate(manifest, said):
    out = patchkit("validate", "--manifest", manifest, cwd=PROOF)
    assert out.returncode == 0, out.stderr
    assert said in out.stdout


def test_the_script_parses_and_is_shellcheck_clean():
    script = PROOF / "gpu_proof.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    if shutil.which("shellcheck") is None:
        pytest.skip("no shellcheck here")
    out = subprocess.run(["shellcheck", "--shell=bash", str(script)], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout


def _tensors(path):
    import numpy as np
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])

    def get(name):
        a, b = header[name]["data_offsets"]
        bits = np.frombuffer(raw[8 + n + a:8 + n + b], dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(header[name]["shape"])
    return np, header, get


def test_the_tiny_model_answers_in_cycles_of_forty_words(tmp_path):
    subprocess.run([sys.executable, str(PROOF / "make_model.py"), str(tmp_path)], check=True)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    np, header, get = _tensors(tmp_path / "model.safetensors")
    assert all(h["dtype"] == "BF16" for k, h in header.items() if k != "__metadata__")
    embed, head = get("model.embed_tokens.weight"), get("lm_head.weight")
    assert embed.shape == head.shape == (config["vocab_size"], config["hidden_size"])

    word, said, margins = 0, [], []   # from <unk>: a prompt of unknown words ends in it
    for _ in range(85):
        x = embed[word] / np.sqrt((embed[word] ** 2).mean())   # RMSNorm, weight 1
        logits = head @ x
        top = np.sort(logits)
        margins.append(float(top[-1] - top[-2]))
        word = int(logits.argmax())
        said.append(word)
    assert len(set(said[:40])) == 40 and said[40:80] == said[:40]
    assert min(said) >= 3                  # never a special word
    # within a cycle the next word wins by far more than the layers' noise adds (a few units);
    # the first word after a special one is any word: it only picks the cycle
    assert min(margins[1:]) > 20

    tok = json.loads((tmp_path / "tokenizer.json").read_text())
    words = {i: w for w, i in tok["model"]["vocab"].items()}
    text = "".join(words[i] for i in said[:32]).replace("\u2581", " ").strip()
    assert degenerate(text) is None, text   # smoke's chat check: 32 tokens
    assert text.isascii() and text.replace(" ", "").isalpha()
