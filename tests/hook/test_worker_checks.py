"""The pipelined worker refuses what it was not built for, before swapping anything in."""

import pytest

from initpipe_vllm.errors import UnsupportedRunnerError
from initpipe_vllm.worker import SUPPORTED_VLLM, check_vllm_version


def test_other_vllm_versions_are_refused_naming_both():
    with pytest.raises(
        UnsupportedRunnerError,
        match=r"built for vLLM 0\.32\.0, but vLLM 0\.33\.1 is installed.*"
        r"vllm==0\.32\.0",
    ):
        check_vllm_version("0.33.1")


def test_the_supported_version_and_its_local_builds_pass():
    check_vllm_version(SUPPORTED_VLLM)
    check_vllm_version(SUPPORTED_VLLM + "+cpu")


def test_installed_vllm_is_the_supported_one():
    vllm = pytest.importorskip("vllm")
    check_vllm_version(vllm.__version__)


def test_worker_cls_prints_the_qualname(capsys):
    from initpipe.cli import main

    assert main(["worker-cls"]) == 0
    assert capsys.readouterr().out.strip() == "initpipe_vllm.worker.PipelinedWorker"
    assert main(["worker-cls", "--bogus"]) == 2
