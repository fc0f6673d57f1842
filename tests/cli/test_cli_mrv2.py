"""`initpipe graph` on the Model Runner V2 catalog: draw, check, export, diff against v1.

``initpipe_vllm.mrv2`` imports neither torch nor vLLM, so these run without either (the
trace overlay of a real MRv2 run is in ``tests/vllm/test_mrv2.py``).
"""

from __future__ import annotations

import json
import sys

from initpipe.cli import main

TARGET = "initpipe_vllm.mrv2:pipeline"


def test_the_mrv2_catalog_draws_and_checks(capsys) -> None:
    assert main(["graph", TARGET, "--check"]) == 0
    assert "is valid: 33 stages (model: 12, kv_cache_config: 21)" in capsys.readouterr().out
    assert main(["graph", TARGET]) == 0
    text = capsys.readouterr().out
    assert "pipeline 'initpipe_vllm.mrv2'" in text
    for stage in ("model_state", "attn_backend", "cudagraph_manager", "kv_caches_by_layer"):
        assert stage in text


def test_the_mrv2_export_names_its_stages_and_effects(capsys) -> None:
    assert main(["graph", TARGET, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    names = {s["name"] for s in data["stages"]}
    assert {"samplers", "speculator_attn", "kv_block_zeroer"} <= names
    effects = {e for s in data["stages"] for e in s.get("effects", [])}
    assert "compilation_config.cudagraph_mode" in effects and "layer.kv_cache" in effects


def test_the_mrv2_catalog_diffs_against_the_v1_catalog(capsys) -> None:
    """Different catalogs: exit 1, each side's own stages listed (none is shared)."""
    assert main(["graph", TARGET, "--diff", "initpipe_vllm"]) == 1
    out = capsys.readouterr().out
    assert "+ stage attn_backend (kv_cache_config)" in out  # MRv2's
    assert "- stage metadata_builders (kv_cache_config)" in out  # v1's


def test_the_mrv2_html_page_is_written(tmp_path, capsys) -> None:
    out = tmp_path / "mrv2.html"
    assert main(["graph", TARGET, "--format", "html", "-o", str(out)]) == 0
    page = out.read_text()
    assert "kv_caches_by_layer" in page and "initpipe_vllm.mrv2" in page


def test_importing_the_mrv2_catalog_imports_neither_torch_nor_vllm() -> None:
    import subprocess

    code = (
        "import sys, initpipe_vllm.mrv2 as m; m.catalog(); "
        "print(sorted({'torch', 'vllm'} & set(sys.modules)))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
