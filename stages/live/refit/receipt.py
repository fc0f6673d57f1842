"""What a refit returns and what :func:`initpipe_vllm.weights_info` says: plain attrs records.

Like the resize report's, they travel from the engine core process as plain dicts
(``to_dict``/``from_dict``). Nothing here imports torch or vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

from .probe import ProbeResult

__all__ = ["RefitReceipt", "RefitStep", "WeightsInfo", "WeightsState"]

WeightsState = Literal["serving", "released", "failed", "busy"]


@attrs.frozen(kw_only=True)
class RefitStep:
    """One step of a refit: whether it completed, its milliseconds and the bytes it moved
    (freed, loaded, hashed or allocated, summed over ranks; 0 for the others)."""

    name: str
    ok: bool
    ms: float
    bytes: int = 0


@attrs.frozen(kw_only=True)
class RefitReceipt:
    """What one refit did, step by step, and what it proved.

    Attributes:
        version: the weights version now served (vLLM's ``weight_version`` on every
            output); previous_version: the one before.
        digests: each rank's weights digest after loading (``sha256:...``), in rank order.
        digest_checked: whether the caller's expected digest was compared (and matched).
        model_runner: the workers' vLLM model runner, ``"v1"`` or ``"v2"``.
        weights: where the weights came from: ``kind`` (``folder`` / ``tensors``),
            ``path``, ``bytes``, ``transport`` (``in-process`` or ``folder``) and
            ``checked_against`` (the checkpoint whose names, shapes and dtypes the new
            weights matched before anything changed; None when there was none to check).
        blocks_before / blocks_after: the KV cache's blocks (0: released or failed).
        kv_bytes_per_rank: KV bytes on each rank afterwards.
        steps: every step in order, each with ok, ms and bytes.
        caches: each weight-derived cache, and what the refit did and checked about it.
        checks: the load compared with a fresh load (:mod:`.coverage`): ``coverage``
            (every parameter written), ``derived`` (every module's post-load processing
            re-run), ``ties`` (the same parameters share storage) and ``repaired`` (module
            -> why initpipe re-ran its processing after vLLM's reload skipped it).
        probe: the probe's result (``probe.ran`` False when it was disabled).
        mode: ``wait`` or ``abort``; requests_waited / requests_aborted: the request ids.
        total_s: the whole refit's wall seconds, in the engine core.
    """

    version: str
    previous_version: str
    digests: tuple[str, ...]
    digest_checked: bool
    model_runner: str | None = None
    weights: Mapping[str, Any] = attrs.field(factory=dict, hash=False)
    blocks_before: int
    blocks_after: int
    kv_bytes_per_rank: tuple[int, ...]
    steps: tuple[RefitStep, ...]
    caches: Mapping[str, str] = attrs.field(factory=dict, hash=False)
    checks: Mapping[str, Any] = attrs.field(factory=dict, hash=False)
    probe: ProbeResult
    mode: str
    requests_waited: tuple[str, ...] = ()
    requests_aborted: tuple[str, ...] = ()
    total_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-able)."""
        return attrs.asdict(self, recurse=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RefitReceipt:
        """Rebuild from :meth:`to_dict`'s output."""
        f = dict(data)
        f["steps"] = tuple(RefitStep(**s) for s in f["steps"])
        f["probe"] = ProbeResult.from_dict(f["probe"])
        for key in ("digests", "kv_bytes_per_rank", "requests_waited", "requests_aborted"):
            f[key] = tuple(f.get(key, ()))
        f["weights"], f["caches"] = dict(f["weights"]), dict(f["caches"])
        f["checks"] = dict(f.get("checks", {}))
        return cls(**f)

    def __str__(self) -> str:
        mib = 1 << 20
        lines = [
            f"refit {self.previous_version} -> {self.version} ({self.mode}, runner "
            f"{self.model_runner}): "
            f"{self.blocks_before} -> {self.blocks_after} blocks, {self.total_s * 1e3:.1f} ms",
            f"  weights: {self.weights.get('kind')} {self.weights.get('path') or ''} "
            f"{self.weights.get('bytes', 0) / mib:.1f} MiB".rstrip(),
            f"  digest{'s' if len(self.digests) > 1 else ''}: {', '.join(self.digests)}"
            + (" (as expected)" if self.digest_checked else ""),
            "  steps: "
            + ", ".join(f"{s.name} {s.ms:.1f} ms{'' if s.ok else ' FAILED'}" for s in self.steps),
            "  caches: " + "; ".join(f"{k} {v}" for k, v in self.caches.items()),
        ]
        if self.checks:
            lines.append(
                "  checked against a fresh load: "
                + "; ".join(f"{k} {v}" for k, v in self.checks.items() if k != "repaired" and v)
            )
            for module, why in dict(self.checks.get("repaired") or {}).items():
                lines.append(f"  repaired: {module} ({why})")
        p = self.probe
        if p.ran:
            lines.append(
                f"  probe: {len(p.prompts)} prompts, tokens {[list(t) for t in p.tokens]}, "
                f"warm hits {list(p.cached_tokens)} tokens, max logprob diff "
                f"{p.max_logprob_diff:.2g}" + (", as expected" if p.checked_expected else "")
            )
            if p.reference_checked:
                scored = sum(len(prompt) - 1 for prompt in p.prompts)
                lines.append(
                    f"  reference: {scored} prompt logprobs against your model's, max diff "
                    f"{p.reference_max_diff:.2g}, mean {p.reference_mean_diff:.2g} (tolerance "
                    f"{p.reference_tolerance[0]:g}, {p.reference_tolerance[1]:g} on average)"
                )
        else:
            lines.append(f"  probe: {'; '.join(p.problems) or 'not run'}")
        return "\n".join(lines)


@attrs.frozen(kw_only=True)
class WeightsInfo:
    """The engine's weights now (:func:`initpipe_vllm.weights_info`).

    Attributes:
        state: ``serving``; ``released`` (KV cache released: a refit brings it back);
            ``failed`` (the last refit failed: nothing is served until a refit succeeds);
            ``busy`` (a refit, resize, release or resume is running).
        version: the weights version served (vLLM's ``weight_version``; ``"default"``
            before any refit).
        digests: each rank's digest after the last refit (empty before the first).
        refits / failures: refits completed and failed since start.
        last_refit_s: the last completed refit's seconds (None before the first).
        failure: where the last refit failed (``step``, ``rank``, ``error``) while
            ``failed``.
        last_receipt: the last completed refit's receipt.
    """

    state: WeightsState
    version: str
    digests: tuple[str, ...] = ()
    refits: int = 0
    failures: int = 0
    last_refit_s: float | None = None
    failure: Mapping[str, Any] | None = attrs.field(default=None, hash=False)
    last_receipt: RefitReceipt | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-able)."""
        return attrs.asdict(self, recurse=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WeightsInfo:
        """Rebuild from :meth:`to_dict`'s output."""
        f = dict(data)
        f["digests"] = tuple(f.get("digests", ()))
        last = f.get("last_receipt")
        f["last_receipt"] = None if last is None else RefitReceipt.from_dict(last)
        return cls(**f)
