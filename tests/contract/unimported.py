"""Run contract code in a fresh interpreter where importing vLLM or torch fails.

In the suite's own process vLLM and torch are usually imported already (other modules
build engines), so "the installed vLLM is read, never imported" can only be checked in a
new interpreter. There, a finder placed first on ``sys.meta_path`` answers for ``vllm`` and
``torch`` (and their submodules) with their real specs, whose loader refuses to execute
them and records the attempt. ``sys.modules["vllm"] = None`` would not do: then
``importlib.util.find_spec("vllm")`` returns None, and the code under test could not even
find the installed vLLM it is meant to read.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

from waiting import HANG_S

__all__ = ["run_unimported"]

_PRELUDE = """
import importlib.abc, importlib.machinery, json, sys

ATTEMPTS = []


class _Refuse(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        ATTEMPTS.append(module.__name__)
        raise ImportError(f"{module.__name__} was imported: it may only be read")


class _Poison(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] not in ("vllm", "torch"):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None:
            spec.loader = _Refuse()
        return spec


sys.meta_path.insert(0, _Poison())
"""

_EPILOGUE = """
loaded = sorted(m for m in sys.modules if m.partition(".")[0] in ("vllm", "torch"))
print(json.dumps({"result": result, "attempts": ATTEMPTS, "loaded": loaded}))
"""


def run_unimported(body: str) -> Any:
    """Run ``body`` (which sets ``result`` to JSON-able data) where importing vLLM or torch
    fails; return ``result``. Fails the test, quoting the interpreter's error, if ``body``
    raised or anything tried to import vLLM or torch (even where the ImportError was caught).
    """
    code = _PRELUDE + textwrap.dedent(body) + _EPILOGUE
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S
    )
    assert res.returncode == 0, f"the fresh interpreter failed:\n{res.stderr[-3000:]}"
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["attempts"] == [], f"imported, not read: {out['attempts']}"
    assert out["loaded"] == [], f"in sys.modules afterwards: {out['loaded']}"
    return out["result"]
