"""The two stock methods Model Runner V2's stages stand for, and a ``@stage`` for a step of
each: ``load_step(*calls, **stage_options)`` declares a model-phase step of stock MRv2's
``load_model``, ``kv_step(...)`` a KV-phase step of its ``initialize_kv_cache``
(:func:`initpipe_vllm.catalogs.runner_step`: the mirrors and the vLLM calls in one line of
arguments)."""

from __future__ import annotations

import functools

from initpipe import KV, MODEL

from ..catalogs import runner_step
from ..vllm_names import MRV2_RUNNER

#: The stock methods the stages mirror.
LOAD_MODEL = f"{MRV2_RUNNER}.load_model"
INIT_KV = f"{MRV2_RUNNER}.initialize_kv_cache"

load_step = functools.partial(runner_step, MODEL, LOAD_MODEL)
kv_step = functools.partial(runner_step, KV, INIT_KV)
