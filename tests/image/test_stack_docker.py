"""The stack an image is proven on, through the real Docker Engine: a base holding vLLM and
FlashInfer as pip installs them (dist-info, METADATA, RECORD with sha256), torch and
nvidia-cutlass-dsl; its pins and ``image.requires`` judged, ``patchset.lock`` written, and
``--locked`` refusing a base that differs."""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from contextlib import ExitStack

import pytest

from testing import flashinfer as fi
from testing import imageproject as ip
from testing import release_cache, stackbase
from testing.imageproject import RELEASE, SITE, write_manifest
from testing.dockersdk import created_of
from testing.progress import Said
from testing.upstream import unified
from patchkit import cli, manifest
from patchkit.commands import build_image, lock, verify
from patchkit.errors import ImageError, ManifestError
from patchkit.image import base as image_base
from patchkit.image import lockfile
from patchkit.engines.docker import Engine
from patchkit.imageref import Platform
from patchkit.run import run_spec
from patchkit.series.applier import apply_series

pytestmark = [pytest.mark.docker, pytest.mark.real_vllm, pytest.mark.timeout(1800)]


@pytest.fixture(scope="session")
def stack_bases(docker_client, bases, registry) -> dict:
    """The stack base (torch 2.11.0) and one like it holding torch 2.10.0."""
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    return {torch: stackbase.ensure_stack_base(docker_client, bases[RELEASE],
                                               f"{registry}/pk-test/vllm-stack:{RELEASE}-t{torch}",
                                               torch=torch, log=log)
            for torch in ("2.11.0", "2.10.0")}


@pytest.fixture(scope="module")
def engine() -> Engine:
    """The engine, with room for a shared machine's load: each stopped container of the stack
    base is a full copy of its files on the vfs driver."""
    return Engine.connect(timeout=600)


def fi_pristine() -> str:
    with zipfile.ZipFile(stackbase.flashinfer_wheel()) as zf:
        return zf.read(fi.FI_FILE).decode()


@pytest.fixture(scope="module")
def project(tmp_path_factory, stack_bases, registry):
    """The image project on the stack base, FlashInfer pinned beside vLLM with no patches of
    its own; applied once."""
    root = tmp_path_factory.mktemp("stack")
    ip.make_project(root, base="x", tag=f"{registry}/pk-test/stack-e2e:{{ref}}")
    m = write_manifest(root, stack_bases["2.11.0"]["tag"])
    workdir = root / ".patchkit" / "vllm"
    assert apply_series(m, run=run_spec(m, cache=release_cache()), workdir=workdir).ok
    return root, m, workdir


@pytest.fixture(scope="module")
def fi_project(tmp_path_factory, stack_bases, registry):
    """The image project with FlashInfer 0.6.15 from PyPI beside vLLM 0.27.1 from PyPI, and
    the real FlashInfer patch (testing.flashinfer.FI_PATCH) in its series, on the stack base;
    applied once (both packages)."""
    root = tmp_path_factory.mktemp("stack-fi")
    ip.make_project(root, base="x", tag=f"{registry}/pk-test/stackimg-fi:{{ref}}")
    (root / "patches" / "flashinfer").mkdir()
    (root / "patches" / "flashinfer" / "fi-moe-activations.diff").write_text(fi.FI_PATCH)
    # a name no earlier run used, so that the build below is made, not found (the name is in
    # its inputs), and its log is this run's
    m = write_manifest(root, stack_bases["2.11.0"]["tag"],
                       name=f"pk-stackimg-{secrets.token_hex(4)}", fi_patch=True)
    workdir = root / ".patchkit" / "vllm"
    applied = apply_series(m, run=run_spec(m, cache=release_cache()), workdir=workdir)
    assert applied.ok, applied.to_json()
    return root, m, workdir, applied


@dataclasses.dataclass
class Built:
    report: build_image.BuildReport
    lines: list[str]       # what the build logged
    first: lock.LockReport
    again: lock.LockReport
    data: bytes            # patchset.lock as the first lock wrote it
    reads: list[dict]      # the engine's events: the containers the build made of the base


@pytest.fixture(scope="module")
def built(fi_project, engine, docker_client, stack_bases) -> Built:
    """``fi_project`` built once on the stack base, then locked twice: the one image (and the
    one lock) the tests of the stack share."""
    root, m, workdir, _ = fi_project
    log = Said()
    time.sleep(1.1)   # the events' clock counts seconds: none of an earlier step's
    since = time.time()
    report = build_image.run(m, build_image.Request(workdir=workdir, apply=False,
                                                    tag=f"{ip.REGISTRY}/pk-test/"
                             "stackimg-e2e:1", engine=engine), progress=log)
    assert report.ok and not report.reused, report.to_dict()
    base = stack_bases["2.11.0"]["tag"]
    reads = created_of(docker_client, {base, docker_client.images.get(base).id}, since,
                       time.time())
    first = lock.run(m, workdir=workdir, engine=engine)
    data = (root / "patchset.lock").read_bytes()
    again = lock.run(m, workdir=workdir, engine=engine)
    return Built(report, log.lines, first, again, data, reads)


def test_the_build_reads_the_base_through_one_container(built):
    """Its distributions judged, FlashInfer's files proven, the overlay planned: one container
    of the base for all of them, counted by the engine's own events."""
    assert len(built.reads) == 1, built.reads


@pytest.fixture(scope="module")
def held(stack_bases, engine) -> image_base.BaseStack:
    """What the stack base (torch 2.11.0) holds, read once."""
    return image_base.read(engine, stack_bases["2.11.0"]["tag"], Platform.parse("linux/arm64"))


def test_the_base_is_proven_by_record_and_the_lock_holds_the_stack(built, stack_bases, project,
                                                                   held):
    lines = built.lines
    assert any(line.endswith("2 file(s) to replace are pristine (2 proved by RECORD)")
               for line in lines), lines
    assert any(line.startswith("base ") and "distribution(s) installed in "
               "/usr/local/lib/python3.11/dist-packages" in line for line in lines), lines
    text = built.data.decode()
    base = stack_bases["2.11.0"]
    assert f'name = "{base["tag"]}"' in text
    assert f'digest = "{base["repo_digest"].split("@")[1]}"' in text
    assert '[packages.vllm]\nversion = "0.27.1"\ncommit = "' in text
    assert 'source = "pypi"' in text   # where each pristine tree came from
    # apply made FlashInfer's checkout beside vLLM's
    assert re.search(r'\[packages\.flashinfer\]\nversion = "0\.6\.15"\ncommit = "[0-9a-f]{40}"\n'
                     r'source = "pypi"', text), text
    installed = text.split("[installed]\n")[1].splitlines()
    assert installed == ['flashinfer-python = "0.6.15"', 'nvidia-cutlass-dsl = "4.5.0"',
                         'torch = "2.11.0"', 'vllm = "0.27.1"']
    assert built.first.written and not built.again.written  # the second run wrote the same bytes
    # a package with no patches of its own is a checkout the lock names too
    _, m, workdir = project
    pinned = lockfile.patched_packages(m, workdir, held.installed)["flashinfer"]
    assert (pinned.version, pinned.source) == ("0.6.15", "pypi")
    assert re.fullmatch("[0-9a-f]{40}", pinned.commit), pinned


def test_locked_build_and_verify_accept_the_same_stack(built, fi_project, engine):
    root, m, workdir, _ = fi_project
    log = Said()
    report = build_image.run(m, build_image.Request(workdir=workdir, apply=False, locked=True,
                                                    engine=engine), progress=log)
    assert report.ok and report.reused
    assert any("patchset.lock names" in line for line in log.lines)
    checked = verify.run(m, verify.Request(workdir, image=built.report.tag, locked=True,
                                           engine=engine))
    assert checked.ok and checked.locked == []
    assert checked.to_dict()["locked"] == {"ok": True, "differences": []}


def test_locked_refuses_a_base_that_differs_naming_each_difference(built, fi_project,
                                                                   stack_bases, docker_client,
                                                                   engine):
    root, m, workdir, _ = fi_project
    other = stack_bases["2.10.0"]
    m2 = write_manifest(root, other["tag"], requires="{}", name=m.name, fi_patch=True)
    tag = f"{ip.REGISTRY}/pk-test/stack-refused:1"
    try:
        with pytest.raises(ImageError) as err:
            build_image.run(m2, build_image.Request(workdir=workdir, apply=False, tag=tag,
                                                    locked=True, engine=engine))
        lines = str(err.value).splitlines()
        assert lines[0] == f"base {other['tag']} differs from patchset.lock in 2 ways"
        assert lines[1] == (f"  base digest {other['repo_digest'].split('@')[1]}, the lock has "
                            f"{stack_bases['2.11.0']['repo_digest'].split('@')[1]}")
        assert lines[2] == "  torch 2.10.0, the lock has 2.11.0"
        assert not docker_client.images.list(name=tag)
        # the image built on the locked stack, against a lock that names the other base
        lock_text = (root / "patchset.lock").read_text()
        (root / "patchset.lock").write_text(lock_text.replace('torch = "2.11.0"',
                                                              'torch = "2.10.0"'))
        checked = verify.run(m, verify.Request(workdir, image=built.report.tag, locked=True,
                                               engine=engine))
        assert not checked.ok
        assert checked.locked == ["torch 2.11.0, the lock has 2.10.0"]
    finally:
        write_manifest(root, stack_bases["2.11.0"]["tag"], name=m.name, fi_patch=True)
        (root / "patchset.lock").write_bytes(built.data)


@pytest.mark.parametrize("change, error, message", [
    (dict(requires='{torch: "==2.10.*"}'), ImageError,
     "base {base} has torch 2.11.0, image.requires wants ==2.10.*"),
    (dict(requires='{cuda-python: ">=12"}'), ImageError,
     "base {base} has no cuda-python installed (no cuda_python-*.dist-info in "
     "/usr/local/lib/python3.11/dist-packages), image.requires wants >=12"),
    (dict(fi_ref="v0.6.16"), ImageError,
     "base {base} holds flashinfer-python 0.6.15, the pin is v0.6.16"),
    (dict(extra_package="  b12x:\n    repo: pypi\n    ref: v0.1.0\n"), ManifestError,
     "patchset.yaml:10: packages.b12x.dist: base {base} has no b12x installed (no "
     "b12x-*.dist-info in /usr/local/lib/python3.11/dist-packages)"),
])
def test_a_base_is_refused_before_the_apply_for_each_reason(project, stack_bases, tmp_path,
                                                            docker_client, change, error,
                                                            message, engine):
    root, m, workdir = project
    base = stack_bases["2.11.0"]["tag"]
    try:
        bad = write_manifest(root, base, **change)
        fresh = tmp_path / ".patchkit" / "vllm"
        with pytest.raises(error) as err:
            build_image.run(bad, build_image.Request(
                workdir=fresh, tag=f"{ip.REGISTRY}/pk-test/stack-refused:2", engine=engine))
        assert str(err.value) == message.format(base=base)
        assert not fresh.exists()   # refused before the apply
    finally:
        write_manifest(root, base)


def test_cli_missing_and_malformed_lock_are_one_line_exit_2_and_lock_reruns(fi_project, built):
    root, m, workdir, _ = fi_project
    saved = (root / "patchset.lock").read_bytes()
    try:
        for content in (None, "[base\n"):
            if content is None:
                (root / "patchset.lock").unlink()
            else:
                (root / "patchset.lock").write_text(content)
            for argv in (["build-image", "--no-apply", "--locked"],
                         ["verify", "--image", "x:1", "--locked"]):
                proc = subprocess.run([sys.executable, "-m", "patchkit", *argv, "--workdir"
                                       if argv[0] == "build-image" else "--format",
                                       str(workdir) if argv[0] == "build-image" else "text"],
                                      cwd=root, capture_output=True, text=True, timeout=120)
                assert proc.returncode == 2, proc.stderr
                assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
                assert "patchset.lock" in proc.stderr
    finally:
        (root / "patchset.lock").write_bytes(saved)
    proc = subprocess.run([sys.executable, "-m", "patchkit", "lock", "--workdir", str(workdir),
                           "--timeout", "600"],
                          cwd=root, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"unchanged {root / 'patchset.lock'}: base ")
    assert proc.stdout.rstrip().endswith("2 package(s), 4 installed distribution(s)")
    assert (root / "patchset.lock").read_bytes() == saved


def test_a_flashinfer_checkout_beside_vllm_is_proven_pristine_on_the_base(fi_project, engine,
                                                                          stack_bases):
    """The real patch on the real FlashInfer 0.6.15 file, its applied checkout beside vLLM's,
    proven on the base by RECORD; a RECORD that does not hash to the pristine file is refused.
    (What the image ships of it: the end-to-end test below reads it back.)"""
    root, m, workdir, _ = fi_project
    rel = fi.FI_FILE
    lines: list[str] = []
    with image_base.opened(engine, stack_bases["2.11.0"]["tag"],
                           Platform.parse("linux/arm64")) as held:
        proofs = image_base.prove_packages(m, workdir, held, lines.append)
        assert proofs["flashinfer"].by_record == (rel,)
        assert lines == ["flashinfer: the files to replace in /usr/local/lib/python3.11/"
                         "dist-packages are pristine (1 proved by RECORD)"]
        # a RECORD that does not hash to the pristine file: refused, naming it
        dist = held.installed.get("flashinfer-python")
        bad = dict(dist.record)
        bad[rel] = dataclasses.replace(bad[rel], sha256="A" * 43)
        broken = image_base.BaseStack(held.image, held.files)
        vars(broken)["installed"] = dataclasses.replace(   # what the base's RECORD would say
            held.installed, dists={**held.installed.dists,
                                   "flashinfer-python": dataclasses.replace(dist, record=bad)})
        with pytest.raises(ImageError, match=f"{rel} is not the pristine file of "
                                             r"flashinfer-python v0.6.15 .*RECORD hash differs"):
            image_base.prove_packages(m, workdir, broken)


# ------------------------------------------------- both packages patched, end to end


def test_both_packages_applied_built_read_back_verified_and_locked(fi_project, built,
                                                                   stack_bases, engine, capsys):
    root, m, workdir, applied = fi_project
    base = stack_bases["2.11.0"]
    statuses = {(p.package, p.id): p.status for p in applied.patches}
    assert statuses[("flashinfer", "fi-moe-activations")] == "applied"
    assert statuses[("vllm", "draft-quant-config")] == "applied"
    fi_tree = workdir.parent / "flashinfer"
    assert (fi_tree / fi.FI_FILE).read_text() == fi.patched(fi_pristine())

    tag = built.report.tag
    assert "flashinfer: 1 changed file(s) into " + SITE in built.lines, built.lines
    assert any(line == f"flashinfer: the files to replace in {SITE} are pristine "
               "(1 proved by RECORD)" for line in built.lines), built.lines
    # the image's one layer holds FlashInfer's patched file where the base installed it
    with engine.files(built.report.image_id, tag) as files:
        inside = files.read(f"{SITE}/{fi.FI_FILE}")
    assert inside is not None and inside.decode() == fi.patched(fi_pristine())
    assert inside == (fi_tree / fi.FI_FILE).read_bytes()

    checked = verify.run(m, verify.Request(workdir, image=tag, engine=engine))
    assert checked.ok, checked.to_dict()
    sections = checked.to_dict()["packages"]
    assert sections["flashinfer"] == {"version": "0.6.15", "site": SITE, "assertions": 2,
                                      "passed": 2}
    assert sections["vllm"]["version"] == RELEASE and sections["vllm"]["passed"] == 3
    code = cli.main(["verify", "--image", tag, "--manifest", str(m.path), "--timeout", "600",
                     "--package", "flashinfer"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"flashinfer 0.6.15 in {SITE}: 2/2 assertions passed" in out.splitlines()
    assert "vllm " not in out and "ok: 2/2 assertions passed" in out

    locked = built.first
    commit = applied.packages["flashinfer"].commit
    assert locked.lock.packages["flashinfer"] == lockfile.Pinned("0.6.15", commit, "pypi")
    assert locked.lock.base_digest == base["repo_digest"].split("@")[1]
    assert verify.run(m, verify.Request(workdir, image=tag, locked=True,
                                        engine=engine)).locked == []


def test_verify_image_fails_on_flashinfers_file_not_patched_in_it(fi_project, stack_bases,
                                                                   engine):
    """The stack base itself holds the pristine FlashInfer file: its assertions fail there,
    named by file and patch, while the report still names the package."""
    root, m, workdir, _ = fi_project
    checked = verify.run(m, verify.Request(workdir, image=stack_bases["2.11.0"]["tag"],
                                           packages=("flashinfer",), engine=engine))
    assert not checked.ok
    assert [(a.patch, a.file, a.ok) for a in checked.verify] == [
        ("fi-moe-activations", fi.FI_FILE, False)] * 2
    assert checked.packages[0].name == "flashinfer" and checked.packages[0].passed == 0


def test_a_changed_flashinfer_patch_makes_a_new_image(fi_project, built, tmp_path, real_vllm,
                                                      engine):
    """The image of the series as it was is in the engine (``built``); the project with the
    patch changed builds another one, not that."""
    root, m, workdir, _ = fi_project
    copy = tmp_path / "proj"
    shutil.copytree(root, copy, symlinks=True)
    token = secrets.token_hex(4)   # a patch no earlier run built
    text = fi.patched(fi_pristine()) + f"\n_PATCHKIT_TEST_TOKEN = {token!r}\n"
    (copy / "patches" / "flashinfer" / "fi-moe-activations.diff").write_text(
        unified(fi.FI_FILE, fi_pristine(), text))
    tag = f"{ip.REGISTRY}/pk-test/stackimg-change:1"
    m2 = manifest.load(copy / "patchset.yaml")
    again = build_image.run(m2, build_image.Request(workdir=copy / ".patchkit" / "vllm", tag=tag,
                                                    engine=engine))
    assert again.ok and not again.reused, again.to_dict()
    assert again.image_id != built.report.image_id
    with engine.files(again.image_id, tag) as files:
        assert files.read(f"{SITE}/{fi.FI_FILE}").decode() == text


def _layer_file(ref: str, dest, path: str) -> bytes | None:
    """``path`` in the last layer of ``ref`` as the registry holds it (skopeo, no engine)."""
    subprocess.run(["skopeo", "copy", "--src-tls-verify=false", f"docker://{ref}",
                    f"dir:{dest}"], check=True, capture_output=True)
    layers = json.loads((dest / "manifest.json").read_text())["layers"]
    with tarfile.open(dest / layers[-1]["digest"].split(":", 1)[1]) as tar:
        member = tar.extractfile(path.lstrip("/"))
        return member.read() if member is not None else None


def test_no_daemon_locked_ships_flashinfers_file_and_refuses_a_lock_that_differs(
        fi_project, built, registry, tmp_path):
    root, m, workdir, _ = fi_project
    saved = (root / "patchset.lock").read_bytes()
    tag = f"{registry}/pk-test/stackimg-nd:{secrets.token_hex(4)}"
    log = Said()
    built = build_image.run(m, build_image.Request(workdir=workdir, apply=False, tag=tag,
                                                   push=True, no_daemon=True, locked=True,
                                                   timeout=600), progress=log)
    try:
        assert built.ok, built.to_dict()
        assert "the base is the one patchset.lock names" in log.lines
        got = _layer_file(tag, tmp_path / "img", f"{SITE}/{fi.FI_FILE}")
        assert got == (workdir.parent / "flashinfer" / fi.FI_FILE).read_bytes()
        (root / "patchset.lock").write_text(saved.decode().replace('torch = "2.11.0"',
                                                                   'torch = "2.10.0"'))
        other = f"{registry}/pk-test/stackimg-nd:{secrets.token_hex(4)}-refused"
        with pytest.raises(ImageError) as err:
            build_image.run(m, build_image.Request(workdir=workdir, apply=False, tag=other,
                                                   push=True, no_daemon=True, locked=True,
                                                   timeout=600))
        base = m.image.base
        assert str(err.value).splitlines() == [
            f"base {base} differs from patchset.lock in 1 way",
            "  torch 2.11.0, the lock has 2.10.0"]
        missing = subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--raw",
                                  f"docker://{other}"], capture_output=True)
        assert missing.returncode != 0   # nothing pushed under the tag
    finally:
        (root / "patchset.lock").write_bytes(saved)
        subprocess.run(["skopeo", "delete", "--tls-verify=false", f"docker://{tag}"],
                       capture_output=True)


def pinned_from_base(fi_project, tmp_path, pin: str) -> manifest.Manifest:
    """A copy of ``fi_project`` (no checkouts) with FlashInfer's pin lines replaced by ``pin``."""
    root = fi_project[0]
    path = root / "patchset.yaml"
    copy = tmp_path / "proj"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns(".patchkit"))
    text = path.read_text().replace("    repo: pypi\n    ref: v0.6.15\n", pin, 1)
    assert text != path.read_text()
    (copy / "patchset.yaml").write_text(text)
    return manifest.load(copy / "patchset.yaml")


@pytest.mark.parametrize("pin", ["    repo: image\n", "    repo: pypi\n    ref: base\n"])
def test_flashinfers_pin_and_files_read_from_the_base(fi_project, engine, tmp_path, pin):
    """``repo: image`` (the pin ``base`` implied) patches the FlashInfer files the base has
    installed; ``ref: base`` with PyPI pins the release the base's dist-info names."""
    from patchkit.image import basevllm

    m = pinned_from_base(fi_project, tmp_path, pin)
    copy = m.root
    spec = run_spec(m, engine=engine, cache=release_cache())
    lines: list[str] = []
    with ExitStack() as hold:
        held = basevllm.held(spec, hold)
        bases = basevllm.for_packages(spec, held, log=lines.append)
        assert lines == [f"base {m.image.base} holds flashinfer-python 0.6.15 in {SITE}"]
        report = apply_series(m, run=spec, workdir=copy / ".patchkit" / "vllm", bases=bases)
    assert report.ok, report.to_json()
    fi_pkg = report.packages["flashinfer"]
    assert fi_pkg.version == "0.6.15"
    assert fi_pkg.source == ("pypi" if "pypi" in pin else "image")
    got = (copy / ".patchkit" / "flashinfer" / fi.FI_FILE).read_text()
    assert got == fi.patched(fi_pristine())


def test_rebase_check_of_flashinfer_pinned_from_the_base(fi_project, tmp_path, monkeypatch,
                                                         capsys):
    """``ref: base`` with PyPI: the pin is the release the base's dist-info names (read through
    the engine, with rebase-check's --timeout), the targets its PyPI releases after it; vLLM's
    matrix reads the same pin.  ``repo: image`` alone has no releases: one line."""
    from patchkit.source import pypi
    from patchkit.versions import release_tag

    m = pinned_from_base(fi_project, tmp_path, "    repo: pypi\n    ref: base\n")
    listed = pypi.SOURCE.tags
    # PyPI's own list, cut at 0.6.16: each later release would be one more wheel to fetch
    monkeypatch.setattr(pypi.SOURCE, "tags", lambda *a, **k: [
        t for t in listed(*a, **k) if (release_tag(t) or release_tag("v99")) <= release_tag(
            "v0.6.16")])
    waits: list[float] = []
    connect = Engine.connect.__func__

    def spy(cls, host=None, *, timeout, link=None):
        waits.append(timeout)
        return connect(cls, host, timeout=timeout, link=link)

    monkeypatch.setattr(Engine, "connect", classmethod(spy))
    args = ["--manifest", str(m.path), "--timeout", "600", "--format", "json"]
    code = cli.main(["rebase-check", "--package", "flashinfer", "--releases", *args])
    out = capsys.readouterr()
    assert code == 0, out.err
    data = json.loads(out.out)
    assert (data["package"], data["package_pin"]) == ("flashinfer", "base")
    assert data["patches"][0]["status"] == {"v0.6.15.post1": "applied", "v0.6.16": "applied"}
    err = out.err.splitlines()
    assert f"base {m.image.base} holds flashinfer-python 0.6.15 in {SITE}" in err
    assert "flashinfer releases after base: v0.6.15.post1, v0.6.16" in err
    assert waits == [600.0]
    # vLLM's matrix keeps FlashInfer at the pin the base names (it was refused before)
    code = cli.main(["rebase-check", "--to", f"v{RELEASE}", *args])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert f"base {m.image.base} holds flashinfer-python 0.6.15 in {SITE}" in out.err
    cells = {e["id"]: e["status"] for e in json.loads(out.out)["targets"][0]["patches"]}
    assert cells["fi-moe-activations"] == "skipped" and cells["draft-guard"] == "applied"

    image = pinned_from_base(fi_project, tmp_path / "image", "    repo: image\n")
    code = cli.main(["rebase-check", "--package", "flashinfer", "--releases", "--manifest",
                     str(image.path), "--timeout", "600"])
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert (code, err) == (2, [
        "patchkit rebase-check: error: the flashinfer source 'image' is one base's package and has no "
        "releases to list; name the targets with --to, or list pypi among "
        "packages.flashinfer.repo"])
