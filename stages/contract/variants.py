"""Per-release variants of one initpipe function, picked by the contract.

What belongs here: :func:`by_release`, the one way a function that mirrors or calls vLLM
code gets a variant for another vLLM release. The base function (valid for every release
whose declarations it carries) is decorated ``@by_release("capability")``; a release's
variant sits beside it, declared for that release, and registers itself::

    @by_release("resize")
    @vllm_uses("resize", mirrors=("vllm.v1.core.sched.scheduler:Scheduler.__init__",))
    def rebuild_scheduler_kv(core, new): ...

    @rebuild_scheduler_kv.variant("0.33.0")
    @vllm_uses("resize", mirrors=(...), release="0.33.0",
               replaces=("initpipe_vllm.live.core.replay:rebuild_scheduler_kv",))
    def _rebuild_scheduler_kv_0_33_0(core, new): ...

A call runs the variant of the release whose lock the installed vLLM matched for that
capability (:func:`~.report.installed_release`), else the base: never a comparison of
version strings. A vLLM that matches no lock is refused there, by name. Nothing here
imports vLLM.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar

__all__ = ["Released", "by_release"]

P = ParamSpec("P")
R = TypeVar("R")


class Released(Generic[P, R]):
    """A function with per-release variants (:func:`by_release`); calling it runs the
    variant of the installed vLLM's release (the contract's answer for
    :attr:`capability`), else :attr:`base`."""

    def __init__(self, capability: str, base: Callable[P, R]) -> None:
        self.capability = capability
        self.base = base
        self.variants: dict[str, Callable[P, R]] = {}
        functools.update_wrapper(self, base)

    def variant(self, *releases: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """Register the decorated function as this function's variant for ``releases``
        (several: a later release carries the variant forward unchanged).

        Raises:
            ValueError: one of ``releases`` already has a variant, or none is named.
        """
        if not releases:
            raise ValueError(f"{self.base.__qualname__}.variant(): name at least one release")

        def register(func: Callable[P, R]) -> Callable[P, R]:
            for release in releases:
                if release in self.variants:
                    msg = (
                        f"{self.base.__qualname__} already has a variant for vLLM {release} "
                        f"({self.variants[release].__qualname__})"
                    )
                    raise ValueError(msg)
            for release in releases:
                self.variants[release] = func
            return func

        return register

    def for_release(self, release: str) -> Callable[P, R]:
        """The implementation that runs on vLLM ``release``."""
        return self.variants.get(release, self.base)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        from .report import installed_release

        return self.for_release(installed_release(self.capability))(*args, **kwargs)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        """As a method: bound like the function it wraps."""
        return self if obj is None else functools.partial(self.__call__, obj)


def by_release(capability: str) -> Callable[[Callable[P, R]], Released[P, R]]:
    """Make the decorated function the base of a :class:`Released`: its calls run the
    variant of the release the installed vLLM matched for ``capability``."""

    def wrap(func: Callable[P, R]) -> Released[P, R]:
        return Released(capability, func)

    return wrap
