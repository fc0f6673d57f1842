"""The test kit's server launcher (``initpipe_vllm.testing.server``) and its ports: each
server's port stays reserved until it answers, and a server whose port was taken anyway
starts again on another.

The property is the launcher's, not vLLM's: the server here is a stand-in (a small HTTP
server answering ``GET /health``) that binds its port exactly as vLLM's does
(``SO_REUSEADDR``, then listen), put in place of ``server_command``. No vLLM starts.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from initpipe_vllm.testing import server as launcher
from initpipe_vllm.testing.server import PORT_ATTEMPTS, ServerSpec, running_servers

#: The stand-in server: first says whether its port is held for it (a plain bind, without
#: SO_REUSEADDR, is refused), then serves ``/health`` on it.
STAND_IN = r"""
import errno, http.server, socket, sys

port = int(sys.argv[1])
probe = socket.socket()
try:
    probe.bind(("127.0.0.1", port))
    held = False
except OSError as err:
    held = err.errno == errno.EADDRINUSE
probe.close()
print(f"port held for me: {held}", flush=True)


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


# HTTPServer sets SO_REUSEADDR, as vLLM's create_server_socket does
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """Servers started by the launcher are :data:`STAND_IN` on the port it chose."""

    def command(engine_kwargs: Any, port: int, extra_args: Sequence[str] = ()) -> list[str]:
        return [sys.executable, "-c", STAND_IN, str(port)]

    monkeypatch.setattr(launcher, "server_command", command)


def _hang_up(listener: socket.socket) -> None:
    """Accept and close each connection: the launcher's health check on a taken port gets
    its answer (none) at once instead of waiting for its timeout."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        conn.close()


@pytest.fixture
def occupy(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[int], list[int]]]:
    """``occupy(n)``: the launcher's next ``n`` reserved ports are taken at once by another
    listener (as a server that chose the same number earlier would); returns the list of
    the ports taken, filled as it happens."""
    real = launcher.reserve_port
    sockets: list[socket.socket] = []
    taken: list[int] = []
    left = [0]

    def reserve() -> socket.socket:
        reservation = real()
        if left[0] > 0:
            left[0] -= 1
            other = socket.socket()
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            other.bind(reservation.getsockname())
            other.listen()
            threading.Thread(target=_hang_up, args=(other,), daemon=True).start()
            sockets.append(other)
            taken.append(reservation.getsockname()[1])
        return reservation

    def occupy_next(n: int) -> list[int]:
        left[0] = n
        return taken

    monkeypatch.setattr(launcher, "reserve_port", reserve)
    yield occupy_next
    for s in sockets:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)  # wakes its accept()
        s.close()


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_each_port_is_held_for_its_server_until_it_answers(stand_in: None, tmp_path: Path) -> None:
    specs = [ServerSpec(name, {"model": "m"}) for name in ("a", "b")]
    with running_servers(specs, tmp_path) as servers:
        assert _port(servers["a"].url) != _port(servers["b"].url)
        for server in servers.values():
            assert launcher.health(server.url) and server.process.poll() is None
            assert "port held for me: True" in server.log.read_text()
            assert server.reservation is None  # released once it answered
    assert sorted(p.name for p in tmp_path.glob("*.log")) == ["a.log", "b.log"]


def test_a_server_whose_port_was_taken_starts_again_on_another(
    stand_in: None, occupy: Callable[[int], list[int]], tmp_path: Path
) -> None:
    taken = occupy(1)
    with running_servers([ServerSpec("a", {"model": "m"})], tmp_path) as servers:
        (port,) = taken
        assert _port(servers["a"].url) != port
        assert launcher.health(servers["a"].url)
    first = (tmp_path / f"a.port{port}.log").read_text()
    assert "Address already in use" in first  # the attempt whose port was taken, kept


def test_a_port_taken_on_every_attempt_fails_naming_the_server(
    stand_in: None, occupy: Callable[[int], list[int]], tmp_path: Path
) -> None:
    taken = occupy(PORT_ATTEMPTS)
    why = f"server 'a' exited with 1 while starting \\(its port was taken on all {PORT_ATTEMPTS}"
    with (
        pytest.raises(RuntimeError, match=why) as failed,
        running_servers([ServerSpec("a", {"model": "m"})], tmp_path),
    ):
        pass
    assert len(taken) == PORT_ATTEMPTS
    assert "Address already in use" in str(failed.value)
