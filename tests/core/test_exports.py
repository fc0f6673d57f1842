"""The public surface is exactly ``__all__``, and the core stays free of torch/vllm."""

import subprocess
import sys

import initpipe


def test_all_matches_public_names():
    public = {n for n in vars(initpipe) if not n.startswith("_")} | {"__version__"}
    # submodules are implementation detail except `errors`
    public -= {"annotations"}
    modules = {n for n in public if type(getattr(initpipe, n)).__name__ == "module"}
    assert set(initpipe.__all__) == (public - modules) | {"errors"}


def test_import_initpipe_imports_neither_torch_nor_vllm():
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['vllm'] = None\n"
        "import initpipe, initpipe.errors\n"
        "import initpipe._pipeline, initpipe._run, initpipe._trace\n"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_import_initpipe_does_not_load_torch():
    code = "import sys, initpipe; print(sorted(m for m in ('torch', 'vllm') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
