"""Several workers on one machine: what vLLM's CPU build needs before it spawns them.

vLLM 0.32's CPU worker binds each rank's OpenMP threads to cores. Left to itself it binds
by NUMA node and stops with "Not enough allowed NUMA nodes to bind threads of N local
CPUWorkers" on a machine with fewer NUMA nodes than ranks (any one-socket machine with
tensor parallelism). ``VLLM_CPU_OMP_THREADS_BIND`` (``"0-3|4-7"``: one core list per local
rank) replaces that; :func:`default_cpu_thread_binding` sets it, when the user has not,
by splitting the cores this process may use into one contiguous share per rank.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping, Sequence

__all__ = ["BIND_ENV", "cpu_thread_binding", "default_cpu_thread_binding"]

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def _span(cores: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    parts: list[str] = []
    start = prev = cores[0]
    for core in [*cores[1:], None]:
        if core is not None and core == prev + 1:
            prev = core
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if core is not None:
            start = prev = core
    return ",".join(parts)


def cpu_thread_binding(world_size: int, cores: Sequence[int] | None = None) -> str:
    """A ``VLLM_CPU_OMP_THREADS_BIND`` value giving each of ``world_size`` local ranks an
    equal contiguous share of ``cores`` (default: the cores this process may run on). With
    fewer cores than ranks, ranks share cores round-robin (slow, but it runs).

    Raises:
        ValueError: ``world_size`` below 1, or no cores.
    """
    if world_size < 1:
        msg = f"world_size={world_size}: expected 1 or more ranks"
        raise ValueError(msg)
    if cores is None:
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        cores = cores or list(range(os.cpu_count() or 1))
    cores = sorted(cores)
    if not cores:
        msg = "no cores to bind worker threads to"
        raise ValueError(msg)
    if len(cores) < world_size:
        shares = [[cores[rank % len(cores)]] for rank in range(world_size)]
    else:
        per = len(cores) // world_size
        shares = [cores[rank * per : (rank + 1) * per] for rank in range(world_size)]
    return "|".join(_span(share) for share in shares)


def default_cpu_thread_binding(
    world_size: int, environ: MutableMapping[str, str] | None = None
) -> str | None:
    """Set ``VLLM_CPU_OMP_THREADS_BIND`` for ``world_size`` local ranks unless it is set
    or there is one rank; return the value set (None: nothing set). Only the CPU build
    reads it; call it before the engine starts (the workers inherit the environment)."""
    env = os.environ if environ is None else environ
    if world_size <= 1 or env.get(BIND_ENV):
        return None
    value = cpu_thread_binding(world_size)
    env[BIND_ENV] = value
    return value
