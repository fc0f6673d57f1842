"""A weight refit as a step list on the live-transaction driver, in the engine core.

What belongs here: the refit's checks (:func:`prepare`: the engine, the state, the new
weights against the engine's checkpoint, the size and memory — all before anything
changes), its steps (pause, teardown, load, verify, digest, kv_phase, warmup, scheduler,
caches, probe) on the core's driver — the pause, KV phase, warm-up and scheduler steps
are the core's (:mod:`initpipe_vllm.live.core.steps`) — its fail-closed undo, its commit,
and :func:`refit`, which drives it and answers a :class:`~.receipt.RefitReceipt` or a
typed error; and the room's two ``EngineCore`` methods (:data:`METHODS`) on the core's
entry. The frontend's part is in :mod:`.api`; the weights' checks, load and digest on
every rank in :mod:`.weights`.

Fail closed: once a step has started, the previous weights may be gone (vLLM reloads in
place), so no failure goes back to them. Every rank drops its KV cache, the prefix cache is
emptied, requests queued during the refit finish with an error, and the engine refuses
requests (``RefitFailedError``; HTTP 503) until a later refit succeeds. That refit starts
from the failed state as from a released one: no step needs what the failed one left.
"""

from __future__ import annotations

import functools
import logging
import time
from concurrent.futures import Future
from typing import Any

import attrs

from ...contract.declare import vllm_uses
from ...errors import RefitError, RefitRefusedError, ResizeError
from ..core import rank as ranks
from ..core.entry import Method, answer, in_own_process, live_call, rank_statuses, rpc
from ..core.records import RankFailure, RankStatus, RankTeardown
from ..core.replay import (
    Plan,
    memory_shortfall,
    plan,
    plan_or_explain,
    rebuild_scheduler_kv,
    refusal,
)
from ..core.report import RankReport
from ..core.state import engine_state, released_figures, weights_version
from ..core.steps import (
    KV_PHASE,
    PAUSE,
    SCHEDULER,
    WARMUP,
    Clock,
    Live,
    RankStepFailed,
    flush_finished,
)
from ..core.txn import Step, Transaction, TransactionFailed, drive
from . import probe as probes
from .receipt import RefitReceipt, RefitStep, WeightsInfo
from .weights import (
    RankCaches,
    RankDigest,
    RankLoad,
    RankPrecheck,
    RankVerify,
    Schema,
    Source,
    casts,
    folder_schema,
    mismatches,
    rank_caches,
    rank_digest,
    rank_load,
    rank_precheck,
    rank_verify,
    same_tensor,
    tensors_schema,
    tied_copies,
)

__all__ = [
    "METHODS",
    "REFIT",
    "REFIT_METHOD",
    "REFIT_RELEASED",
    "REFIT_UTILITY",
    "WEIGHTS_METHOD",
    "WEIGHTS_UTILITY",
    "Prepared",
    "Refit",
    "WeightsState",
    "info",
    "prepare",
    "refit",
    "refused",
    "weights_state",
]

logger = logging.getLogger("vllm.initpipe")

#: The utility methods this room adds to ``EngineCore`` (called by name).
REFIT_METHOD = "initpipe_refit"
WEIGHTS_METHOD = "initpipe_weights_info"


# -- state --------------------------------------------------------------------------------
@attrs.define
class WeightsState:
    """What refits keep on the engine core (beside the core's ``EngineState``, which holds
    the failure while the engine is ``failed``)."""

    refits: int = 0
    failures: int = 0
    digests: tuple[str, ...] = ()
    last_refit_s: float | None = None
    last_receipt: RefitReceipt | None = None
    #: the checkpoint the engine's weights follow: names, shapes, dtypes, and where it is
    schema: Schema | None = None
    schema_from: str | None = None
    #: the parameters that share storage on the ranks (from the last refit's checks)
    ties: tuple[tuple[str, ...], ...] = ()


def weights_state(core: Any) -> WeightsState:
    ws = getattr(core, "_initpipe_weights_state", None)
    if ws is None:
        ws = core._initpipe_weights_state = WeightsState()
    return ws


#: What :func:`info` copies from the state: the fields the two records share.
_PUBLISHED = frozenset(field.name for field in attrs.fields(WeightsInfo))


def info(core: Any) -> WeightsInfo:
    """The engine's weights now."""
    st, ws = engine_state(core), weights_state(core)
    state = "busy" if st.busy else st.state
    # what the state keeps that the info publishes, by field name
    published = attrs.asdict(ws, recurse=False, filter=lambda field, _: field.name in _PUBLISHED)
    return WeightsInfo(
        state=state,  # type: ignore[arg-type]
        version=weights_version(core),
        failure=st.failure,
        **published,
    )


# -- the context ----------------------------------------------------------------------------
@attrs.define(kw_only=True)
class Refit(Live):
    """A resize's context plus what a refit carries through its steps.

    Attributes:
        source: the weights to load.
        expected_digest: the digest(s) the caller expects, one per rank (None: unchecked).
        probe: the probe to run.
        version: the version the engine serves afterwards.
        trace: each step's record, in order.
        digests: each rank's digest once the digest step ran.
        caches: what the caches step did, by cache.
        probe_result: the probe's result once it ran.
        stale: the prefix cache's block hashes before the refit (none may survive it).
    """

    source: Source
    expected_digest: tuple[str, ...] | None
    probe: probes.Probe
    version: str
    trace: list[RefitStep] = attrs.field(factory=list)
    moved: dict[str, int] = attrs.field(factory=dict)
    digests: tuple[str, ...] = ()
    caches: dict[str, str] = attrs.field(factory=dict)
    probe_result: probes.ProbeResult | None = None
    stale: frozenset[Any] = frozenset()
    unpaused: Any = None
    weights_bytes: int = 0
    checks: dict[str, Any] = attrs.field(factory=dict)


def _recorded(step: Step[Refit]) -> Step[Refit]:
    """``step`` with its ok, milliseconds and bytes written to the receipt's trace."""

    def do(live: Refit) -> None:
        start = time.perf_counter()
        try:
            step.do(live)
        except BaseException:
            live.trace.append(RefitStep(name=step.name, ok=False, ms=_ms(start)))
            raise
        live.trace.append(
            RefitStep(name=step.name, ok=True, ms=_ms(start), bytes=live.moved.get(step.name, 0))
        )

    return attrs.evolve(step, do=do)


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1e3


# -- the steps ------------------------------------------------------------------------------
def _teardown(live: Refit) -> None:
    answers = live.on_ranks("teardown", ranks.rank_teardown, RankTeardown)
    live.moved["teardown"] = sum(a.bytes_freed for a in answers)


def _load(live: Refit) -> None:
    live.on_ranks("load", rank_load, RankLoad, live.source)
    live.moved["load"] = live.weights_bytes


def _verify(live: Refit) -> None:
    """Every rank's load against the fresh load its engine started with (coverage, ties,
    the modules whose processing initpipe re-ran): a difference fails the refit closed."""
    answers: list[RankVerify] = live.on_ranks("verify", rank_verify, RankVerify)
    live.moved["verify"] = sum(a.bytes_compared for a in answers)
    first = min(answers, key=lambda a: a.rank)
    repaired: dict[str, str] = {}
    for a in answers:
        repaired.update(a.repaired)
    live.checks.update(
        coverage=(
            f"every parameter written on every rank: {first.written} by their loaders, "
            f"{first.tied} through a tie (rank {first.rank} of {len(answers)})"
        ),
        derived=(
            f"{first.modules} modules' post-load processing re-run, as a fresh load does; "
            f"{first.kernels} packed kernels that kept their weight compute what it does"
        ),
        ties=(
            f"{first.ties} group{'' if first.ties == 1 else 's'} of parameters sharing "
            "storage, as after a fresh load"
        ),
        bytes=(
            f"{first.tensors_compared} parameters kept as loaded hold the checkpoint's "
            f"bytes ({sum(a.bytes_compared for a in answers)} bytes compared)"
        ),
        repaired={k: f"tied to {v}: vLLM's reload skipped it" for k, v in repaired.items()},
    )


def _digest(live: Refit) -> None:
    answers: list[RankDigest] = live.on_ranks("digest", rank_digest, RankDigest)
    live.digests = tuple(a.digest for a in sorted(answers, key=lambda a: a.rank))
    live.moved["digest"] = sum(a.bytes_hashed for a in answers)
    want = live.expected_digest
    if want is not None and tuple(want) != live.digests:
        lines = [
            f"rank {r}: {got}, expected {exp}"
            for r, (got, exp) in enumerate(zip(live.digests, want, strict=False))
            if got != exp
        ]
        if len(want) != len(live.digests):
            lines.append(f"{len(want)} digests expected for {len(live.digests)} ranks")
        raise ValueError("the weights digest differs from the expected one: " + "; ".join(lines))


def _kv_phase(live: Refit) -> None:
    KV_PHASE.do(live)
    live.moved["kv_phase"] = sum(r.bytes_allocated for r in live.ranks.values())


def _hashes(core: Any) -> frozenset[Any]:
    """The block hashes the scheduler's prefix cache holds now."""
    pool = core.scheduler.kv_cache_manager.block_pool
    table = pool.cached_block_hash_to_block
    return frozenset(getattr(table, "_cache", table))


@vllm_uses(
    "refit",
    mirrors=("vllm.v1.core.block_pool:BlockHashToBlockMap.__init__",),
    calls=(
        "vllm.v1.core.block_pool:BlockPool.cached_block_hash_to_block",
        "vllm.v1.core.sched.scheduler:Scheduler.reset_encoder_cache",
        "vllm.v1.core.sched.scheduler:Scheduler.reset_prefix_cache",
    ),
)
def _caches(live: Refit) -> None:
    """Every cache computed from the old weights is empty — checked, not assumed."""
    core = live.core
    held = _hashes(core)
    if held:
        raise RuntimeError(f"the new prefix cache holds {len(held)} blocks before serving")
    core.scheduler.reset_encoder_cache()
    encoder = core.scheduler.encoder_cache_manager
    left = len(getattr(encoder, "cached", {}) or {})
    if left:
        raise RuntimeError(f"the scheduler's encoder cache still holds {left} entries")
    answers: list[RankCaches] = live.on_ranks("caches", rank_caches, RankCaches)
    worker_left = {a.rank: a.encoder_entries for a in answers if a.encoder_entries}
    if worker_left:
        raise RuntimeError(f"encoder cache entries left on ranks {worker_left}")
    live.caches["prefix_cache"] = (
        f"emptied and checked: {len(live.stale)} cached blocks before, none after"
    )
    live.caches["encoder_cache"] = "emptied and checked (scheduler and every rank)"
    live.caches["kv_connector"] = "none configured (a refit refuses a KV connector)"
    live.caches["multimodal_inputs"] = (
        "kept: preprocessed inputs do not depend on the weights (vLLM's sender and "
        "receiver caches stay in step)"
    )


def _probe(live: Refit) -> None:
    core, probe = live.core, live.probe
    if not probe.enabled:
        live.probe_result = probes.ProbeResult(ran=False, ok=True, problems=("disabled",))
        return
    runner_type = getattr(core.vllm_config.model_config, "runner_type", "generate")
    if runner_type != "generate":  # the probe generates tokens
        why = f"not run: a {runner_type} model (it generates no tokens)"
        live.probe_result = probes.ProbeResult(ran=False, ok=True, problems=(why,))
        return
    prompts = probe.prompts
    if prompts is None:
        model = core.vllm_config.model_config
        prompts = probes.default_prompts(
            model.get_vocab_size(),
            int(core.vllm_config.cache_config.block_size),
            int(model.max_model_len),
            probe.max_tokens,
        )
    result = probes.run(
        core,
        probe,
        prompts,
        unpaused=live.unpaused,
        paused=live.paused_all,
        dtype=core.vllm_config.model_config.dtype,
    )
    live.probe_result = result
    _drop_probe_blocks(live)
    if not result.ok:
        raise probes.ProbeFailed(result)


def _drop_probe_blocks(live: Refit) -> None:
    """The probe's blocks leave the engine: the scheduler's KV cache manager is built again
    for the new cache (the block pool, its free queue and prefix cache as a fresh engine's),
    then checked empty. The probe's KV data stays in free blocks, as any served request's."""
    assert live.new is not None
    flush_finished(live.core)
    rebuild_scheduler_kv(live.core, live.new)
    if _hashes(live.core):
        raise RuntimeError("the prefix cache could not be emptied after the probe")


# -- fail closed and commit -----------------------------------------------------------------
@vllm_uses(
    "refit",
    mirrors=("vllm.v1.core.sched.scheduler:Scheduler._free_request",),  # finished_req_ids
    calls=(
        "vllm.v1.engine.core:EngineCoreProc._send_error_outputs_to_client",
        "vllm.v1.engine.core:EngineCore.abort_requests",
    ),
)
def _fail_closed(live: Refit) -> None:
    """After any failure: no KV cache on any rank, an empty prefix cache, the queued
    requests finished with an error, the engine ``failed`` (it refuses requests)."""
    core, st = live.core, live.st
    for a in live.rpc(ranks.rank_teardown, RankTeardown):
        if isinstance(a, RankFailure):
            logger.error("initpipe: refit: rank %s kept its KV cache: %s", a.rank, a.error)
    sched = core.scheduler
    queued = [r for r in list(sched.waiting) if not r.is_finished()]
    if queued:
        send = getattr(core, "_send_error_outputs_to_client", None)
        by_client: dict[int, list[str]] = {}
        for r in queued:
            by_client.setdefault(r.client_index, []).append(r.request_id)
        core.abort_requests([r.request_id for r in queued])
        # they never reached a worker, and a runner with no KV cache cannot take the step
        # that would tell it they finished
        sched.finished_req_ids.difference_update(r.request_id for r in queued)
        if send is not None:
            for client, ids in by_client.items():
                send(ids, client)
    try:
        sched.reset_prefix_cache()
    except Exception:
        logger.exception("initpipe: refit: the prefix cache could not be reset")
    st.state, st.bytes_per_rank = "failed", ()
    st.user_pause = live.saved_pause  # what a refit that succeeds gives back
    st.resume_blocks = live.new.num_blocks if live.new is not None else st.resume_blocks
    released_figures(core)
    weights_state(core).digests = ()


@vllm_uses("refit", calls=("vllm.v1.engine.core:EngineCore.set_weight_version",))
def _commit(live: Refit) -> None:
    assert live.new is not None
    st = live.st
    st.state, st.resume_blocks = "serving", None
    st.bytes_per_rank = live.new.bytes_per_rank()
    live.core.set_weight_version(live.version)
    st.cache_weights = live.version  # the prefix cache is empty: what it caches next is
    live.core.scheduler.set_pause_state(live.saved_pause)


_TEARDOWN = Step(name="teardown", do=_teardown, undo=_fail_closed)
_LOAD = Step(name="load", do=_load)
_LATER: tuple[Step[Refit], ...] = (
    Step(name="verify", do=_verify),
    Step(name="digest", do=_digest),
    Step(name="kv_phase", do=_kv_phase),
    WARMUP,
    SCHEDULER,
    Step(name="caches", do=_caches),
    Step(name="probe", do=_probe),
)
#: A refit of a serving engine: its KV cache goes first, any failure fails closed.
REFIT: Transaction[Refit] = Transaction(
    name="refit",
    pause=PAUSE,
    steps=tuple(_recorded(s) for s in (_TEARDOWN, _LOAD, *_LATER)),
    commit=_commit,
)
#: A refit of an engine with no KV cache (released, or failed by an earlier refit).
REFIT_RELEASED: Transaction[Refit] = Transaction(
    name="refit",
    pause=PAUSE,
    steps=tuple(_recorded(s) for s in (attrs.evolve(_LOAD, undo=_fail_closed), *_LATER)),
    commit=_commit,
)


# -- checks ---------------------------------------------------------------------------------
def refused(step: str, reason: str) -> RefitRefusedError:
    """The refusal of a refit before anything changed, naming the step and the reason."""
    return refusal(RefitRefusedError, "refit", step, reason, "with its previous weights")


def _reference(core: Any, ws: WeightsState) -> tuple[Schema | None, str | None]:
    """The checkpoint the new weights must match: the last refit's, else the folder the
    engine started from when it holds safetensors files (None: nothing to check against)."""
    if ws.schema is not None:
        return ws.schema, ws.schema_from
    model = core.vllm_config.model_config
    folder = str(getattr(model, "model_weights", "") or model.model)
    try:
        schema, _size = folder_schema(folder)
    except (OSError, ValueError):
        return None, None
    return schema, folder


@attrs.frozen
class Prepared:
    """What a refit checked and planned before touching anything."""

    statuses: list[RankStatus]
    before: int
    old: Plan | None
    new: Plan
    num_blocks: int | None
    kv_cache_memory_bytes: int | None
    schema: Schema
    schema_from: str | None
    checked_against: str | None
    weights_bytes: int
    stale: frozenset[Any]
    seconds: float
    #: what the ranks load: the caller's, less a tied head's redundant copy
    source: Source | None = None
    #: dtype casts the loaders make, as a fresh load does (``"float32->bfloat16"`` -> count)
    casts: dict[str, int] = attrs.field(factory=dict)


def prepare(
    core: Any,
    source: Source,
    *,
    num_blocks: int | None,
    kv_cache_memory_bytes: int | None,
) -> Prepared:
    """Every check, with no side effect (the engine and rank checks are a resize's, then
    the refit's own on every rank: :func:`_check_engine`).

    Raises:
        RefitRefusedError: nothing changed.
    """
    start = time.perf_counter()
    st, ws = engine_state(core), weights_state(core)
    try:
        statuses = _check_engine(core)
    except ResizeError as err:
        raise refused(err.step, err.reason) from None
    if core.scheduler.connector is not None:
        raise refused(
            "engine",
            f"KV connector {type(core.scheduler.connector).__name__}: the KV it stores was "
            "computed with the old weights and a refit cannot empty it; start the engine "
            "without kv_transfer_config to refit it",
        )
    try:
        if source.path is not None:
            schema, size = folder_schema(source.path)
        else:
            schema, size = tensors_schema(source.tensors or ())
    except (OSError, ValueError) as err:
        raise refused("weights", str(err)) from None
    reference, where = _reference(core, ws)
    cast: dict[str, int] = {}
    if reference is not None:
        copies = tied_copies(reference, schema, ws.ties)
        bad = mismatches(reference, schema, redundant=copies)
        if bad:
            shown = "; ".join(bad[:8]) + (f"; and {len(bad) - 8} more" if len(bad) > 8 else "")
            raise refused(
                "weights", f"the new weights do not match the checkpoint at {where}: {shown}"
            )
        for copy, tied in sorted(copies.items()):
            if not same_tensor(source, copy, tied):
                raise refused(
                    "weights",
                    f"{copy!r} differs from {tied!r}, to which this engine's model ties it: "
                    "a fresh load of these weights would untie them (vLLM unties word "
                    "embeddings when a checkpoint gives the head its own values), a "
                    f"different model than this one; pass {copy!r} equal to {tied!r}, or "
                    "leave it out (a tied model's named_parameters() does), or start a new "
                    "engine on these weights",
                )
        if copies and source.tensors is not None:  # the model's loader skips them anyway
            source = attrs.evolve(
                source, tensors=tuple((n, t) for n, t in source.tensors if n not in copies)
            )
        cast = casts(reference, schema)
    before = int(core.scheduler.kv_cache_config.num_blocks) if st.state == "serving" else 0
    if num_blocks is None and kv_cache_memory_bytes is None:
        num_blocks = before or st.resume_blocks
    try:
        old = plan(core, num_blocks=before) if before else None
        new = plan_or_explain(
            core, num_blocks=num_blocks, kv_cache_memory_bytes=kv_cache_memory_bytes
        )
    except ResizeError as err:
        raise refused(err.step, err.reason) from None
    short = memory_shortfall(statuses, new)
    if short is not None:
        raise refused("memory", short)
    return Prepared(
        statuses=statuses,
        before=before,
        old=old,
        new=new,
        num_blocks=num_blocks,
        kv_cache_memory_bytes=kv_cache_memory_bytes,
        schema=reference if reference is not None else schema,
        schema_from=where if reference is not None else source.path,
        checked_against=where if reference is not None else None,
        weights_bytes=size,
        stale=_hashes(core) if before else frozenset(),
        seconds=time.perf_counter() - start,
        source=source,
        casts=cast,
    )


# -- the refit ------------------------------------------------------------------------------
def _failure(failed: TransactionFailed) -> tuple[str, int | None, str]:
    cause = failed.cause
    if isinstance(cause, RankStepFailed):
        f = cause.failure
        return failed.step, f.rank, f.error
    return failed.step, None, f"{type(cause).__name__}: {cause}"


@vllm_uses(
    "refit",
    calls=(
        "vllm.v1.core.sched.interface:PauseState",
        "vllm.v1.core.sched.scheduler:Scheduler.pause_state",
    ),
)
def refit(
    core: Any,
    source: Source,
    *,
    rpc: Any,
    prepared: Prepared,
    expected_digest: tuple[str, ...] | None,
    probe: probes.Probe,
    version: str | None,
    transport: str,
    kind: str | None = None,
    mode: str = "wait",
    aborted: tuple[str, ...] = (),
    prior_pause: Any = None,
    pause_s: float = 0.0,
) -> RefitReceipt:
    """Drive a refit on ``core``, checked by ``prepared`` (requests holding KV blocks
    must be gone, as for a resize).

    Raises:
        RefitRefusedError: refused (the pause) before anything changed.
        RefitError: a step failed; the engine failed closed (``serving`` False).
    """
    from vllm.v1.core.sched.interface import PauseState

    start = time.perf_counter() - pause_s - prepared.seconds
    st, ws = engine_state(core), weights_state(core)
    p = prepared
    source = p.source or source
    previous = weights_version(core)
    if prior_pause is None:
        prior_pause = core.scheduler.pause_state
    live = Refit(
        core=core,
        st=st,
        clock=Clock(),
        rpc=rpc,
        before=p.before,
        old=p.old,
        new=p.new,
        num_blocks=p.num_blocks,
        kv_cache_memory_bytes=p.kv_cache_memory_bytes,
        prior_pause=prior_pause,
        saved_pause=st.user_pause if st.state != "serving" else prior_pause,
        paused_all=PauseState.PAUSED_ALL,
        unpaused=PauseState.UNPAUSED,
        ranks={s.rank: RankReport(rank=s.rank) for s in p.statuses},
        source=source,
        expected_digest=expected_digest,
        probe=probe,
        version=version or f"refit-{ws.refits + 1}",
        stale=p.stale,
        weights_bytes=p.weights_bytes,
    )
    txn = REFIT if p.before else REFIT_RELEASED
    try:
        drive(txn, live)
    except TransactionFailed as failed:
        step, rank, error = _failure(failed)
        ws.failures += 1
        st.failure = {"step": step, "rank": rank, "error": error}
        on_rank = "" if rank is None else f" on rank {rank}"
        after = (
            "the engine failed closed: it refuses requests until a refit succeeds "
            "(call refit() again)"
            if failed.rolled_back_cleanly
            else "the engine failed closed, but releasing its KV cache failed too: "
            f"{failed.rollback_errors[0][1]}; call refit() again or restart it"
        )
        raise RefitError(
            f"refit failed at step {step!r}{on_rank}: {error}; {after}",
            step=step,
            rank=rank,
            reason=error,
            serving=False,
        ) from failed.cause
    except ResizeError as err:  # the pause refused: nothing changed
        raise refused(err.step, err.reason) from None
    assert live.probe_result is not None
    total = time.perf_counter() - start
    receipt = RefitReceipt(
        version=live.version,
        previous_version=previous,
        digests=live.digests,
        digest_checked=expected_digest is not None,
        model_runner=st.model_runner,
        weights={
            "kind": kind or source.kind,
            "path": source.path,
            "bytes": p.weights_bytes,
            "transport": transport,
            "checked_against": p.checked_against,
            **({"cast": dict(p.casts)} if p.casts else {}),
        },
        blocks_before=p.before,
        blocks_after=p.new.num_blocks,
        kv_bytes_per_rank=p.new.bytes_per_rank(),
        steps=(
            RefitStep(name="plan", ok=True, ms=p.seconds * 1e3),
            RefitStep(name="pause", ok=True, ms=(pause_s + live.clock.steps["pause"]) * 1e3),
            *live.trace,
        ),
        caches=live.caches,
        checks=live.checks,
        probe=live.probe_result,
        mode=mode,
        requests_waited=live.waited,
        requests_aborted=aborted,
        total_s=total,
    )
    ws.refits += 1
    ws.digests = live.digests
    ws.last_refit_s = total
    ws.last_receipt = receipt
    st.failure = None
    ws.schema, ws.schema_from = p.schema, p.schema_from
    logger.info("initpipe: %s", receipt)
    return receipt


# -- the EngineCore methods -----------------------------------------------------------------
def _as_refit_error(err: RefitError | ResizeError) -> RefitError:
    """A refit's error; a resize refusal from a shared step as the refit's refusal."""
    return refused(err.step, err.reason) if isinstance(err, ResizeError) else err


def _check_engine(core: Any) -> list[RankStatus]:
    """A resize's engine and rank checks (and the refit's contract), then every rank's
    own: a model whose reload vLLM gets wrong beyond repair is refused here; the ties
    found are kept for the weights' check."""
    statuses = rank_statuses(core, ("resize", "refit"))
    ties: set[tuple[str, ...]] = set()
    for a in rpc(core, rank_precheck, RankPrecheck):
        if isinstance(a, RankFailure):
            raise refused("engine", f"rank {a.rank}: {a.error}")
        if a.problems:
            raise refused("engine", f"rank {a.rank}: " + "; ".join(a.problems))
        ties.update(tuple(g) for g in a.ties)
    weights_state(core).ties = tuple(sorted(ties))
    return statuses


def _refit_method(
    self: Any, spec: dict[str, Any], mode: str = "wait", aborted: list[str] | None = None
) -> dict[str, Any] | Future[dict[str, Any]]:
    """The refit utility method. ``spec``: ``path`` or ``tensors`` (in-process only),
    ``num_blocks``, ``kv_cache_memory_bytes``, ``expected_digest``, ``probe`` (a dict),
    ``version``, ``transport``."""
    source = Source(path=spec.get("path"), tensors=spec.get("tensors"))
    serving = engine_state(self).state == "serving"
    in_own = in_own_process(self)
    digest = spec.get("expected_digest")

    def run(p: Any, prior: Any, gone: tuple[str, ...], pause_s: float) -> Any:
        return refit(
            self,
            source,
            rpc=functools.partial(rpc, self),
            prepared=p,
            expected_digest=None if digest is None else tuple(digest),
            probe=probes.Probe.from_dict(spec.get("probe") or {}),
            version=spec.get("version"),
            transport=spec.get("transport", "folder"),
            kind=spec.get("kind"),
            mode=mode,
            aborted=gone if in_own else tuple(aborted or ()),
            prior_pause=prior,
            pause_s=pause_s,
        )

    return live_call(
        self,
        "refit",
        mode=mode,
        pause_first=serving,
        prepare=functools.partial(
            prepare,
            self,
            source,
            num_blocks=spec.get("num_blocks"),
            kv_cache_memory_bytes=spec.get("kv_cache_memory_bytes"),
        ),
        run=run,
        answer=functools.partial(
            answer, self, errors=(RefitError, ResizeError), convert=_as_refit_error
        ),
        refusal=refused,
    )


def _weights_method(self: Any) -> dict[str, Any]:
    return info(self).to_dict()


#: The room's ``EngineCore`` methods (the frontend calls them; the plugin installs them).
REFIT_UTILITY = Method(REFIT_METHOD, _refit_method)
WEIGHTS_UTILITY = Method(WEIGHTS_METHOD, _weights_method)
METHODS = (REFIT_UTILITY, WEIGHTS_UTILITY)
