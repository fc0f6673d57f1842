"""The suite's subprocesses only: freeze what survives each full garbage collection.

``tests/conftest.py`` puts this folder first on ``PYTHONPATH`` (``INITPIPE_TEST_GC_FREEZE=0``
leaves it off), so every Python process a test starts runs this file at interpreter start.

Why: a process that imports vLLM tracks about 660,000 objects, and each full collection walks
them all (0.35 s here). vLLM collects explicitly about ten times per engine start and stop,
and the interpreter adds its own full collections as a test allocates: a v1 refit script
spent 13 of its 44 s in the collector. After each full collection this moves the survivors
into the permanent generation (``gc.freeze()``, as vLLM itself does once an engine is up),
so the next one walks only what is new: that script then takes 33 s.

What it changes: only when cyclic garbage is found. Objects that were alive at a full
collection and later become unreachable *cycles* are not freed until something calls
``gc.unfreeze()`` (vLLM's ``EngineCore.shutdown`` does, then collects everything);
reference counting frees all the rest as before. Tokens, logprobs and runner state do not
depend on it; stock and pipelined engines run under the same collector.

Then it runs the next ``sitecustomize`` on ``sys.path``, which this file would otherwise
hide.
"""

import gc
import importlib.util
import os


def _freeze_survivors(phase: str, info: dict[str, int]) -> None:
    if phase == "stop" and info["generation"] == 2:
        gc.freeze()


def _run_next_sitecustomize() -> None:
    """The test kit's ``site_chain`` (standard library only), loaded by its path: importing
    ``initpipe_vllm`` would cost every process 0.2 s."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(root, "stages", "testing", "site_chain.py")
    spec = importlib.util.spec_from_file_location("_initpipe_site_chain", path)
    if spec is None or spec.loader is None or not os.path.exists(path):
        return
    chain = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chain)
    chain.run_next_sitecustomize(__file__)


gc.callbacks.append(_freeze_survivors)
_run_next_sitecustomize()
