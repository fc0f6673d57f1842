"""The process ``initpipe startup run`` starts for an offline engine (run by its path, so
that nothing is imported before its first line): it times its own interpreter start and
``import vllm``, builds ``vllm.LLM`` with the options it is given, optionally waits for one
request's first token, then says ``READY`` and stays up until its stdin closes (so that
every process can flush its spans first).

Usage: ``python _startup_child.py OPTIONS_JSON`` where the JSON holds ``{"llm": {LLM
keyword arguments}, "first_token": bool}``. The environment carries the rest
(``INITPIPE_STARTUP_MARKS``, the OTLP settings, ``VLLM_ENABLE_V1_MULTIPROCESSING``).
"""

import time

MAIN_S = time.time()

import importlib  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402


def main() -> int:
    options = json.loads(sys.argv[1])
    import vllm  # noqa: F401 - what is timed
    from vllm import LLM, SamplingParams

    imported = time.time()
    # by name: this file runs as a script, outside its package
    marks = importlib.import_module("initpipe_vllm.hook.marks")

    marks.install()  # the header, the config timer (the plugins load later, inside LLM())
    created = marks.process_start_s()
    if created is not None:
        marks.interval("interpreter start", created, MAIN_S)
    marks.interval("import vllm", MAIN_S, imported)
    called = time.time()
    try:
        llm = LLM(**options["llm"])
    except Exception as err:  # the report says what happened
        print(f"ENGINE FAILED: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        print(f"FAILED {time.time()!r}", flush=True)
        sys.stdin.read()
        return 1
    ready = time.time()
    if marks.config_started_s is not None:  # LLM() before it builds its config
        marks.interval("engine arguments", called, marks.config_started_s)
    if options.get("first_token"):
        start = time.time()
        llm.generate(
            [{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=1), use_tqdm=False
        )
        marks.interval("first token", start, time.time())
    print(f"READY {ready!r}", flush=True)
    sys.stdin.read()  # until initpipe startup run has every process's spans
    return 0


if __name__ == "__main__":  # vLLM's spawned processes import the main module too
    sys.exit(main())
