"""initpipe: LLM inference worker initialization as a DAG of declared stages.

Declare stages with :func:`stage`, assemble them into a :class:`Pipeline` (validated and
ordered by networkx), then drive a :class:`Run`: ``start()`` -> ``load()`` (model phase)
-> ``initialize_kv_cache()`` (re-runnable KV phase) -> ``close()``.

What belongs in this package: the framework only; it imports attrs and networkx, never
torch, vLLM or ``initpipe_vllm``. Imports point down (``tests/test_layout.py`` checks)::

    errors, files     every error; writing files safely       (no package imports)
    _stage            @stage and StageSpec                    <- errors
    _trace            the trace, critical path, blame         <- files
    _dispatch         the hot loop                            <- _stage, _trace, errors
    _graph            build, validate and order the graph     <- _stage, errors
    _run              the two-phase Run                       <- _dispatch, _graph, _trace
    _extensions       third-party stages                      <- _stage, errors
    _pipeline         Pipeline                                <- all of the above
    testing           fault injection (a test facility)      <- _run, _trace
    view/             export and drawings (no argparse)       <- the core
    cli/              the ``initpipe`` command                <- view/, the core
"""

from __future__ import annotations

from . import errors
from ._extensions import ENTRY_POINT_GROUP, Extension, apply_extensions
from ._graph import REQUIRED
from ._pipeline import Pipeline
from ._run import KVHandoff, Outputs, Run
from ._stage import KV, MODEL, PHASES, Phase, StageSpec, get_spec, is_stage, stage
from ._trace import Trace, TraceEvent, blame, critical_path
from .errors import (
    CycleError,
    DuplicateProducerError,
    DuplicateStageError,
    ExportError,
    ExtensionError,
    GraphProblem,
    GraphvizError,
    InitpipeError,
    InjectedFault,
    InputsError,
    MissingInputError,
    NotAStageError,
    OutputNotAvailableError,
    PhaseOrderError,
    PhaseViolationError,
    PipelineValidationError,
    StageDeclarationError,
    StageError,
    StageOutputError,
    TargetError,
    TeardownError,
    UnknownStageError,
    UnknownStageNameError,
    UsageError,
)

__version__ = "0.1.0"

__all__ = [
    "ENTRY_POINT_GROUP",
    "KV",
    "MODEL",
    "PHASES",
    "REQUIRED",
    "CycleError",
    "DuplicateProducerError",
    "DuplicateStageError",
    "ExportError",
    "Extension",
    "ExtensionError",
    "GraphProblem",
    "GraphvizError",
    "InitpipeError",
    "InjectedFault",
    "InputsError",
    "KVHandoff",
    "MissingInputError",
    "NotAStageError",
    "OutputNotAvailableError",
    "Outputs",
    "Phase",
    "PhaseOrderError",
    "PhaseViolationError",
    "Pipeline",
    "PipelineValidationError",
    "Run",
    "StageDeclarationError",
    "StageError",
    "StageOutputError",
    "StageSpec",
    "TargetError",
    "TeardownError",
    "Trace",
    "TraceEvent",
    "UnknownStageError",
    "UnknownStageNameError",
    "UsageError",
    "__version__",
    "apply_extensions",
    "blame",
    "critical_path",
    "errors",
    "get_spec",
    "is_stage",
    "stage",
]
