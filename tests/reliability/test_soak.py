"""CI soak: 50 KV re-inits with varying num_blocks on one real runner (no engine).

The loop is ``benchmarks/soak.py``'s (the full 500-cycle run is ``python -m benchmarks
--only soak``). Main check: no KV storage or view outlives its KV phase. RSS is compared
from after one warm-up cycle at the largest size, as memory in use (after glibc's
``malloc_trim``); the raw RSS may keep freed buffers cached in the heap, which must
plateau rather than grow.
"""

from __future__ import annotations

import pytest

from benchmarks.soak import rows, soak  # the repository root is on pytest's pythonpath

CYCLES = 50


@pytest.fixture(scope="module")
def result():
    return soak(CYCLES)


def test_no_kv_storage_or_view_outlives_its_kv_phase(result) -> None:
    assert result["storages_tracked"] >= CYCLES  # one backing buffer per cycle
    assert result["current_storages_at_largest"] == 1
    assert result["storages_alive_after_cleanup"] == 0
    assert result["views_alive_after_cleanup"] == 0


def test_never_two_kv_caches_alive_at_once(result) -> None:
    assert result["max_storages_alive_at_once"] == 1


def test_rss_in_use_does_not_grow(result) -> None:
    assert result["malloc_trim"], "glibc malloc_trim unavailable: in-use RSS not measured"
    assert result["rss_growth_trimmed_pct"] < 2.0
    # Raw RSS: glibc may keep a freed KV buffer or two cached in its heap (a plateau, at
    # most a couple of the largest buffers); a leak of one buffer per cycle would add
    # ~25 buffers over the second half.
    raw_peak_growth = result["rss_peak_second_half"] - result["rss_peak_first_half"]
    assert raw_peak_growth < 2 * result["largest_kv_bytes"]


def test_final_runner_state_equals_a_clean_runs(result) -> None:
    assert result["snapshot_diffs"] == []


def test_the_figures_become_benchmark_rows(result) -> None:
    got = {r.name: r for r in rows(result)}
    assert got["KV re-init cycles (varying num_blocks)"].value == CYCLES
    assert all(r.met for r in got.values() if r.met is not None)
