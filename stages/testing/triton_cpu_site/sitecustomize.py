"""Test kit: Model Runner V2 on Triton's interpreter (see initpipe_vllm.testing.triton_cpu).

Put on ``PYTHONPATH`` only by ``triton_cpu.environ()``. At interpreter start, when
``TRITON_INTERPRET=1``, it adds the ``"cpu"`` entry to ``triton.backends.backends`` that
vLLM's ``HAS_TRITON`` check wants, before anything imports vLLM. Then it runs the next
``sitecustomize`` on ``sys.path`` (a system one, or the test suite's), which it would
otherwise hide. Without ``TRITON_INTERPRET=1`` it does nothing.
"""

import os

if os.environ.get("TRITON_INTERPRET") == "1":
    from initpipe_vllm.testing.site_chain import (  # type: ignore[import-not-found]
        run_next_sitecustomize,
    )
    from initpipe_vllm.testing.triton_cpu import (  # type: ignore[import-not-found]
        register_cpu_backend,
    )

    register_cpu_backend()
    run_next_sitecustomize(__file__)
