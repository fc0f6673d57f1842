"""The one driver of a live-engine transaction: pause, steps, commit — or undo in reverse.

What belongs here: the order every change to a running engine follows, and nothing about
what a step does. A :class:`Transaction` is data — a pause, a tuple of :class:`Step` (each a
``do`` and an optional ``undo``) and a commit — and :func:`drive` runs it:

- the pause runs first; if it raises, nothing has changed (a pause cleans up after itself)
  and its error propagates as it is: a refusal;
- the steps run in order; if one raises, the undos run newest first, from the failed step
  (its ``do`` may have changed part of the engine, e.g. some ranks) back to the first,
  every one even if another fails, then the pause's undo; the driver raises
  :class:`TransactionFailed` naming the step, the steps that completed and the ones rolled
  back, as the core's ``StageError`` does for a pipeline phase;
- the commit runs last (nothing is undone after it).

A resize, a release and a resume are step lists on it (:mod:`.steps`); another live change
(a weight refit, a resize that keeps the prefix cache) is another step list, not another
driver. Nothing here imports torch or vLLM.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

import attrs

__all__ = ["Step", "Transaction", "TransactionFailed", "drive"]

#: the context a step works on (contravariant: a step on a shared context serves a room's)
C = TypeVar("C", contravariant=True)


@attrs.frozen(kw_only=True)
class Step(Generic[C]):
    """One step of a transaction.

    Attributes:
        name: the step's name (what a failure and the report call it).
        do: the change, called with the transaction's context.
        undo: what brings the engine back from this step and every step before it that has
            no undo of its own; it also runs when ``do`` itself failed part-way. None: this
            step's effect is undone by an earlier step's undo.
    """

    name: str
    do: Callable[[C], None]
    undo: Callable[[C], None] | None = None


def _unique(_inst: object, _attr: object, steps: tuple[Step[C], ...]) -> None:
    names = [s.name for s in steps]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        msg = f"a transaction's steps need distinct names; given twice: {twice}"
        raise ValueError(msg)


@attrs.frozen(kw_only=True)
class Transaction(Generic[C]):
    """A live change of an engine, as data for :func:`drive`.

    Attributes:
        name: what the change is (``resize``, ``release``, ``resume`` ...).
        pause: quiesces the engine; its ``undo`` lets it serve again after a rollback.
        steps: the changes, in order.
        commit: makes the change the engine's (runs only when every step completed).
    """

    name: str
    pause: Step[C]
    steps: tuple[Step[C], ...] = attrs.field(validator=_unique)
    commit: Callable[[C], None]


class TransactionFailed(RuntimeError):
    """A step raised; the transaction was rolled back (see :func:`drive`).

    Attributes:
        transaction: the transaction's name.
        step: the step that raised.
        completed: steps that completed before it, in order.
        rolled_back: steps whose undo ran, newest first (then the pause's undo ran).
        cause: the step's exception (also ``__cause__``).
        rollback_errors: ``(step, exception)`` for each undo that raised; empty when the
            rollback worked.
    """

    def __init__(
        self,
        transaction: str,
        step: str,
        completed: tuple[str, ...],
        rolled_back: tuple[str, ...],
        cause: Exception,
        rollback_errors: tuple[tuple[str, Exception], ...] = (),
    ) -> None:
        self.transaction, self.step, self.cause = transaction, step, cause
        self.completed, self.rolled_back = completed, rolled_back
        self.rollback_errors = rollback_errors
        lines = [
            f"{transaction} failed at step {step!r}: {type(cause).__name__}: {cause}",
            f"  completed: {', '.join(completed) or 'none'}",
            f"  rolled back: {', '.join(rolled_back) or 'nothing to undo'}",
        ]
        lines += [
            f"  rollback of {s!r} failed: {type(e).__name__}: {e}" for s, e in rollback_errors
        ]
        super().__init__("\n".join(lines))

    @property
    def rolled_back_cleanly(self) -> bool:
        """True when every undo worked: the engine is back where it started."""
        return not self.rollback_errors


def drive(txn: Transaction[C], ctx: C) -> None:
    """Run ``txn`` on ``ctx``: pause, every step, commit; on a step's failure, undo.

    Raises:
        Exception: whatever the pause raised (nothing changed).
        TransactionFailed: a step raised; the steps were undone and the pause lifted.
    """
    txn.pause.do(ctx)
    completed: list[Step[C]] = []
    for step in txn.steps:
        try:
            step.do(ctx)
        except Exception as err:
            raise _rolled_back(txn, ctx, step, completed, err) from err
        completed.append(step)
    txn.commit(ctx)


def _rolled_back(
    txn: Transaction[C], ctx: C, failed: Step[C], completed: list[Step[C]], err: Exception
) -> TransactionFailed:
    rolled: list[str] = []
    errors: list[tuple[str, Exception]] = []
    for step in (failed, *reversed(completed), txn.pause):
        if step.undo is None:
            continue
        try:
            step.undo(ctx)
        except Exception as undo_err:  # every undo runs; the error reports them all
            errors.append((step.name, undo_err))
        if step is not txn.pause:
            rolled.append(step.name)
    return TransactionFailed(
        txn.name,
        failed.name,
        tuple(s.name for s in completed),
        tuple(rolled),
        err,
        tuple(errors),
    )
