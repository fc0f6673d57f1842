"""pytest plugin (``pytest11`` entry point ``initpipe``): test one stage the way the catalog does.

What belongs here: fixtures for stage authors — a real tiny ``VllmConfig`` and loaded runner
(parametrizable by architecture), running a single stage with given inputs, running the
catalog with a stage added or replaced (the stage with its upstream, on a real runner), and
assertions on the trace and on runner snapshots. Importing this module imports neither
torch nor vllm (pytest loads it in every session of the environment); the fixtures do.

Fixtures:

- ``initpipe_model``: the tiny model name or folder (default ``tiny-llama``); override with
  ``@pytest.mark.parametrize("initpipe_model", ["tiny-llama", "tiny-gemma2"])``.
- ``initpipe_runner``: a loaded stock runner for it, with the engine's KV plan
  (``.runner``, ``.vllm_config``, ``.kv_cache_config``).
- ``initpipe_model_outputs``: the catalog's model-phase outputs for that runner.
- ``run_stage``: ``run_stage(stage_fn, **inputs)`` calls one stage with exactly its inputs.
- ``run_with_stage``: ``run_with_stage(stage_fn)`` builds a pipelined runner whose pipeline is
  the catalog with the stage added (or replacing the stage of its name), runs both phases
  and returns the runner; ``runner.initpipe_run`` holds outputs and trace.
- ``runner_snapshot`` and ``assert_same_state(a, b)``: compare runner states exactly.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

__all__ = ["Prepared", "assert_same_state", "assert_stages_ran"]


class Prepared:
    """A loaded runner with the engine's planned KV config."""

    def __init__(self, runner: Any, kv_cache_config: Any) -> None:
        self.runner = runner
        self.vllm_config = runner.vllm_config
        self.kv_cache_config = kv_cache_config

    def current(self) -> Any:
        """``set_current_vllm_config`` for this runner (stages that build vLLM objects need it)."""
        from vllm.config import set_current_vllm_config

        return set_current_vllm_config(self.vllm_config)


def prepare(
    model: str | os.PathLike[str], runner_cls: type | None = None, **overrides: Any
) -> Prepared:
    """Build a tiny real config, a loaded runner and its KV plan."""
    from .builders import build_runner, plan_kv_cache_config, tiny_vllm_config

    cfg = tiny_vllm_config(model, **overrides)
    runner = build_runner(cfg, runner_cls)
    return Prepared(runner, plan_kv_cache_config(runner))


def assert_stages_ran(run: Any, names: list[str], phase: str | None = None) -> None:
    """Fail unless every stage in ``names`` ran and completed (in that order) in ``run``."""
    done = [
        e.name
        for e in run.trace.events
        if e.kind == "stage" and e.outcome == "ok" and (phase is None or e.phase == phase)
    ]
    missing = [n for n in names if n not in done]
    if missing:
        pytest.fail(f"stages did not complete: {missing}; completed: {done}")
    positions = [done.index(n) for n in names]
    if positions != sorted(positions):
        pytest.fail(
            f"stages ran out of order: expected {names}, saw {[done[p] for p in sorted(positions)]}"
        )


#: What may follow an ignored path in a difference line: a key, an index, or the ": a != b".
_AFTER = ("/", "[", ":")


def _ignored(difference: str, paths: tuple[str, ...]) -> bool:
    """Whether a ``path: a != b`` line lies at or below one of ``paths``, by whole path
    components: ``/kv_cache`` covers ``/kv_cache``, ``/kv_cache/...`` and ``/kv_cache[0]``,
    never ``/kv_cache_config``."""
    for path in paths:
        path = path.rstrip("/")
        if difference.startswith(path) and difference[len(path) : len(path) + 1] in _AFTER:
            return True
    return False


def assert_same_state(a: Any, b: Any, *, ignore: str | tuple[str, ...] = ()) -> None:
    """Fail with every difference unless two runners (or snapshots) hold the same state.

    Args:
        a, b: runners or :func:`~initpipe_vllm.snapshot.runner_snapshot` results.
        ignore: a path or paths (as printed in the differences) an extension meant to
            change; each hides that path and everything below it (``/kv_cache`` hides
            ``/kv_cache[0]`` and ``/kv_cache/x``, not ``/kv_cache_config``).
    """
    from .snapshot import diff_snapshots, runner_snapshot

    paths = (ignore,) if isinstance(ignore, str) else tuple(ignore)
    sa = a if isinstance(a, dict) else runner_snapshot(a)
    sb = b if isinstance(b, dict) else runner_snapshot(b)
    diffs = [d for d in diff_snapshots(sa, sb) if not _ignored(d, paths)]
    if diffs:
        shown = "\n  ".join(diffs[:30])
        pytest.fail(f"runner states differ ({len(diffs)} differences):\n  {shown}")


@pytest.fixture
def initpipe_model() -> str:
    """The tiny model the other fixtures build (parametrize to cover architectures)."""
    return "tiny-llama"


@pytest.fixture
def initpipe_runner(initpipe_model: str) -> Prepared:
    """A loaded stock runner for ``initpipe_model`` plus its planned KVCacheConfig."""
    pytest.importorskip("vllm")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    return prepare(initpipe_model)


@pytest.fixture
def initpipe_model_outputs(initpipe_runner: Prepared) -> dict[str, Any]:
    """Every model-phase output of the catalog for ``initpipe_runner``'s loaded model."""
    from .. import catalog
    from ..hook.runner import start_inputs

    run = catalog().start(**start_inputs(initpipe_runner.runner))
    with initpipe_runner.current():
        return dict(run.load(model=initpipe_runner.runner.model))


@pytest.fixture
def run_stage() -> Callable[..., Any]:
    """``run_stage(stage_fn, **inputs)``: call one stage with exactly its declared inputs."""
    from initpipe import get_spec

    def _run(fn: Any, **inputs: Any) -> Any:
        spec = get_spec(fn)
        if spec is None:
            pytest.fail(f"{fn!r} is not an initpipe stage")
        missing = [k for k in spec.inputs if k not in inputs]
        extra = [k for k in inputs if k not in spec.inputs]
        if missing or extra:
            pytest.fail(
                f"stage {spec.name!r} takes {list(spec.inputs)}; missing {missing}, "
                f"unexpected {extra}"
            )
        return fn(**inputs)

    return _run


@pytest.fixture
def run_with_stage(initpipe_model: str) -> Iterator[Callable[..., Any]]:
    """``run_with_stage(*stages)``: a pipelined runner of the installed vLLM release's
    catalog plus these stages, with both phases run on ``initpipe_model``; a stage named
    like a catalog stage replaces it."""
    pytest.importorskip("vllm")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    built: list[Any] = []

    def _run(*stages: Any, model: str | None = None) -> Any:
        from initpipe import Extension, apply_extensions

        from ..hook.runner import pipelined_runner_class
        from .builders import installed_catalog

        # the catalog of the installed vLLM's release (the contract's answer)
        under_test = Extension(name="under-test", add=stages)
        pipeline = apply_extensions(installed_catalog(), [under_test])
        base = pipelined_runner_class()
        # The pipeline must be in place before planning: planning runs the model phase.
        cls = type(
            base.__name__,
            (base,),
            {"initpipe_default_pipeline": pipeline, "__module__": base.__module__},
        )
        prepared = prepare(model or initpipe_model, cls)
        runner = prepared.runner
        with prepared.current():
            runner.initialize_kv_cache(prepared.kv_cache_config)
        built.append(runner)
        return runner

    yield _run
    for runner in built:
        runner.initpipe_run.close()


@pytest.fixture
def runner_snapshot() -> Callable[..., dict[str, Any]]:
    """:func:`initpipe_vllm.snapshot.runner_snapshot`: a runner's init state as plain data."""
    from .snapshot import runner_snapshot as snap

    return snap
