"""Run in a subprocess by test_engine_fault.py: a real in-process engine whose pipelined
worker has one KV stage replaced by a failing one; prints what reaches the user.

Usage: ``python engine_fault_script.py MODEL_DIR STAGE``. Prints one ``RESULT {json}``
line: the exception type and message the ``LLM(...)`` constructor raised (if any), and
whether a StageError is in its cause chain.
"""

import functools
import json
import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from initpipe import KV, StageError, stage
from initpipe_vllm import catalog
from initpipe_vllm.runner import pipelined_runner_class
from initpipe_vllm.testing.equivalence import engine_kwargs

model, name = sys.argv[1], sys.argv[2]
original = catalog().specs[name]


@functools.wraps(original.func)  # keeps the stage's inputs (its signature)
def failing(*args, **kwargs):
    raise OSError(f"disk on fire in {name}")


failing_stage = stage(failing, needs=KV, provides=original.provides, teardown=original.teardown)
pipelined_runner_class().initpipe_default_pipeline = catalog().replace(name, failing_stage)

from vllm import LLM

result = {"raised": None}
try:
    kwargs, _ = engine_kwargs(model)
    LLM(worker_cls="initpipe_vllm.worker.PipelinedWorker", **kwargs)
except BaseException as err:  # report whatever reaches the user
    chain, cur = [], err
    while cur is not None and len(chain) < 10:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    stage_errors = [e for e in chain if isinstance(e, StageError)]
    result = {
        "raised": type(err).__name__,
        "message": str(err),
        "stage_error": (
            {
                "stage": stage_errors[0].stage,
                "completed": list(stage_errors[0].completed),
                "rolled_back": list(stage_errors[0].rolled_back),
                "message": str(stage_errors[0]),
            }
            if stage_errors
            else None
        ),
    }
print("RESULT " + json.dumps(result), flush=True)
