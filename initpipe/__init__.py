"""initpipe: LLM inference worker initialization as a DAG of declared stages.

Declare stages with :func:`stage`, assemble them into a :class:`Pipeline` (validated and
ordered by networkx), then drive a :class:`Run`: ``start()`` -> ``load()`` (model phase)
-> ``initialize_kv_cache()`` (re-runnable KV phase) -> ``close()``.
"""

from __future__ import annotations

from . import errors
from ._extensions import ENTRY_POINT_GROUP, Extension, apply_extensions
from ._graph import REQUIRED
from ._pipeline import Pipeline
from ._run import Outputs, Run
from ._stage import KV, MODEL, PHASES, StageSpec, get_spec, is_stage, stage
from ._trace import Trace, TraceEvent, blame, critical_path
from .errors import (
    CycleError,
    DuplicateProducerError,
    DuplicateStageError,
    ExtensionError,
    InitpipeError,
    InputsError,
    MissingInputError,
    OutputNotAvailableError,
    PhaseOrderError,
    PhaseViolationError,
    PipelineValidationError,
    StageDeclarationError,
    StageError,
    TeardownError,
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
    "Extension",
    "ExtensionError",
    "InitpipeError",
    "InputsError",
    "MissingInputError",
    "Outputs",
    "OutputNotAvailableError",
    "PhaseOrderError",
    "PhaseViolationError",
    "Pipeline",
    "PipelineValidationError",
    "Run",
    "StageDeclarationError",
    "StageError",
    "StageSpec",
    "TeardownError",
    "Trace",
    "TraceEvent",
    "__version__",
    "apply_extensions",
    "blame",
    "critical_path",
    "errors",
    "get_spec",
    "is_stage",
    "stage",
]
