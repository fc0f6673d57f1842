"""``initpipe startup report --compare``: the differences between two start-up reports
(:mod:`.startup_report`'s dicts), per span name, phase and total, and which are
regressions. Nothing else (no reading, no drawing, no vLLM).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

__all__ = ["DEFAULT_MIN_S", "DEFAULT_RATIO", "ONLY", "compare"]


def _r(x: float) -> float:
    return round(x, 6)


#: The defaults of ``--compare``: flagged when both slower by this ratio and by this many
#: seconds (benchmarks/startup.py measures how far back-to-back starts differ).
DEFAULT_RATIO = 1.5
DEFAULT_MIN_S = 0.25
ONLY = ("all", "vllm", "initpipe", "probe")


def _totals(report: Mapping[str, Any], only: str) -> dict[tuple[str, str], float]:
    """(source, name) -> seconds: per name, the largest per-process sum of its spans' wall
    time (ranks run side by side); phases as ``("phase", name)``; the whole start as
    ``("total", "wall")`` and ``("total", "first token")``."""
    per: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for s in report.get("spans", ()):
        if only == "initpipe" and (s["source"], s.get("kind", "span")) != ("initpipe", "span"):
            continue
        if only in ("vllm", "probe") and s["source"] != only:
            continue
        per[(s["source"], s["name"])][s["process"]] += s["end_s"] - s["start_s"]
    out = {key: max(v.values()) for key, v in per.items()}
    if only == "all":
        for phase, data in report.get("phases", {}).items():
            out[("phase", phase)] = data["wall_s"]
        out[("total", "wall")] = report.get("wall_s") or 0.0
        if report.get("first_token_s") is not None:
            out[("total", "first token")] = report["first_token_s"]
    return out


def compare(
    base: Mapping[str, Any],
    now: Mapping[str, Any],
    *,
    ratio: float = DEFAULT_RATIO,
    min_s: float = DEFAULT_MIN_S,
    only: str = "all",
) -> dict[str, Any]:
    """Differences between two reports, per span name, phase and total.

    A row is a regression when it is slower by at least ``min_s`` seconds and by at least
    ``ratio`` (a name absent from ``base`` counts from 0: a new slow stage is a
    regression). ``only``: ``"vllm"`` (vLLM's spans), ``"initpipe"`` (initpipe's stage and
    phase spans; not its named intervals), ``"probe"`` (the start-up probes' spans) or
    ``"all"`` (spans, intervals, phases, totals).

    Returns:
        ``{"rows": [{"name", "source", "base_s", "now_s", "delta_s", "regression"}],
        "regressions": [{"name", "source", "base_s", "now_s"}], "thresholds": {...}}``,
        rows by how much slower, regressions likewise.
    """
    if only not in ONLY:
        raise ValueError(f"only must be one of {', '.join(ONLY)}, not {only!r}")
    if ratio < 1 or min_s < 0:
        raise ValueError("the ratio must be 1 or more and the floor 0 s or more")
    b, n = _totals(base, only), _totals(now, only)
    rows: list[dict[str, Any]] = []
    for key in sorted(set(b) | set(n)):
        base_s, now_s = b.get(key), n.get(key)
        delta = (now_s or 0.0) - (base_s or 0.0)
        slower = now_s is not None and delta >= min_s and (not base_s or now_s / base_s >= ratio)
        rows.append(
            {
                "source": key[0],
                "name": key[1],
                "base_s": base_s,
                "now_s": now_s,
                "delta_s": _r(delta),
                "regression": bool(slower),
            }
        )
    rows.sort(key=lambda r: -r["delta_s"])
    return {
        "thresholds": {"ratio": ratio, "min_s": min_s, "only": only},
        "rows": rows,
        "regressions": [
            {k: r[k] for k in ("name", "source", "base_s", "now_s")}
            for r in rows
            if r["regression"]
        ],
    }
