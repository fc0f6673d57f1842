"""Thread binding for several workers on CPU (``initpipe_vllm.hook.parallel``): one
contiguous share of cores per local rank, in vLLM's ``VLLM_CPU_OMP_THREADS_BIND`` format,
never over a value the user set."""

from __future__ import annotations

import pytest

from initpipe_vllm.hook.parallel import BIND_ENV, cpu_thread_binding, default_cpu_thread_binding


@pytest.mark.parametrize(
    ("world", "cores", "expected"),
    [
        (2, [0, 1], "0|1"),
        (2, range(8), "0-3|4-7"),
        (3, range(7), "0-1|2-3|4-5"),  # equal shares; the odd core is left out
        (4, [0, 1], "0|1|0|1"),  # fewer cores than ranks: shared round-robin
        (1, [0, 2, 3, 5], "0,2-3,5"),
        (2, [5, 4, 7, 6], "4-5|6-7"),  # sorted first
    ],
)
def test_each_rank_gets_a_contiguous_share(world: int, cores: list[int], expected: str) -> None:
    assert cpu_thread_binding(world, list(cores)) == expected


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="world_size=0"):
        cpu_thread_binding(0, [0])
    with pytest.raises(ValueError, match="no cores"):
        cpu_thread_binding(2, [])


def test_the_default_never_overrides_the_user() -> None:
    env: dict[str, str] = {}
    assert default_cpu_thread_binding(1, env) is None and env == {}
    value = default_cpu_thread_binding(2, env)
    assert value is not None and env[BIND_ENV] == value and value.count("|") == 1
    env[BIND_ENV] = "0|0"
    assert default_cpu_thread_binding(2, env) is None and env[BIND_ENV] == "0|0"
