"""The canonical form does not depend on the Python minor version: the lock built from the
installed vLLM under Python 3.12 and 3.13 (where this machine has them; ``ast`` grew
fields such as ``type_params`` there) equals the shipped one, which 3.11 recorded.

The other interpreter reads the package from a folder of links (``initpipe``,
``initpipe_vllm``, ``attrs``/``attr``, ``networkx``: pure Python), never vLLM itself.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from requires import missing

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import json, sys
from initpipe_vllm.contract.declare import declarations
from initpipe_vllm.contract.lock import build
from initpipe_vllm.contract.source import open_source
source = open_source(sys.argv[1])
lock = build(source, declarations(release=source.version))
print(json.dumps({"python": sys.version, "entries": lock.entries}))
"""


def _interpreters() -> list[str]:
    """A working interpreter of each other minor version (this suite runs on 3.11): on PATH,
    or in a pyenv root (whose shims on PATH need a pyenv version selected)."""
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    found = []
    for version in ("3.12", "3.13"):
        if version == here:
            continue
        options = [shutil.which(f"python{version}")]
        options += [str(p) for p in sorted(pyenv.glob(f"versions/{version}*/bin/python{version}"))]
        for exe in filter(None, options):
            ok = subprocess.run([exe, "-c", "pass"], capture_output=True, timeout=60)
            if ok.returncode == 0:
                found.append(exe)
                break
    return found


@pytest.fixture(scope="module")
def path_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import attr
    import attrs
    import networkx

    folder = tmp_path_factory.mktemp("pypath")
    links = {
        "initpipe": ROOT / "initpipe",
        "initpipe_vllm": ROOT / "stages",
        "attrs": Path(attrs.__file__).parent,
        "attr": Path(attr.__file__).parent,
        "networkx": Path(networkx.__file__).parent,
    }
    for name, target in links.items():
        (folder / name).symlink_to(target, target_is_directory=True)
    return folder


@pytest.mark.parametrize("python", _interpreters() or ["none"])
def test_another_python_builds_the_same_lock(python: str, path_folder: Path) -> None:
    from initpipe_vllm.contract.lock import locks
    from initpipe_vllm.contract.source import open_source

    if python == "none":
        missing("no Python 3.12 or 3.13 on PATH or in the pyenv root")
    source = open_source(None)
    res = subprocess.run(
        [python, "-s", "-c", SCRIPT, source.path],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(path_folder), "PYTHONNOUSERSITE": "1"},
        cwd=path_folder,
    )
    absent = re.search(r"No module named '([^']+)'", res.stderr) if res.returncode else None
    if absent and absent[1].partition(".")[0] in sys.stdlib_module_names:
        # that interpreter was built without part of the standard library: its problem
        missing(f"{python} has no standard module {absent[1]!r}")
    # any other missing module is one the folder of links should hold: a bug here
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(res.stdout)
    assert not data["python"].startswith("3.11")
    (shipped,) = [
        lk
        for lk in locks()
        if (lk.distribution, lk.version) == (source.distribution, source.version)
    ]
    differing = sorted(k for k, e in shipped.entries.items() if data["entries"].get(k) != dict(e))
    assert differing == [], f"{python} digests differ for {differing[:10]}"
