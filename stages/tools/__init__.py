"""The vLLM commands of the ``initpipe`` CLI, each a module with ``main(argv)`` and a public
``build_parser()`` (the docs' CLI reference reads it): ``run`` (the main job), ``plan``
(allocation planned on the meta device), ``doctor`` (the contract with vLLM) and
``startup`` (where a start spends its time, with ``startup_report``, ``startup_render``
and ``otlp``). The core CLI (``initpipe.cli``) dispatches to them by name, so it never
imports this package itself.
"""
