"""ServerProcess, the start every test and evaluation uses: a port taken before the server binds it."""

import socket

import pytest
import requests

from sglang_mepic.process.server_process import HOST, ServerError, ServerProcess


def test_a_server_whose_port_was_taken_starts_again_on_another(tiny_model):
    """eval.experiments.capacity --quick starts its four servers at once; one's HTTP port was taken by another's internal
    socket before it bound it, uvicorn gave up while the process lingered, and the run waited out the whole
    start timeout (10 min) for a server that would never answer (make test, 2026-11-29)."""
    server = ServerProcess(tiny_model, startup_timeout=300)
    taken = server.port
    with socket.socket() as holder:
        holder.bind((HOST, taken))  # taken between the port's choice and the server's bind
        holder.listen()
        try:
            server.start()
            assert server.port != taken and server.url.endswith(f":{server.port}")
            assert requests.get(server.url + "/health", timeout=10).status_code == 200
        finally:
            server.stop()


def test_a_port_the_caller_gave_is_not_changed_behind_its_back(tiny_model):
    with socket.socket() as holder:
        holder.bind((HOST, 0))
        holder.listen()
        taken = holder.getsockname()[1]
        server = ServerProcess(tiny_model, port=taken, startup_timeout=300)
        with pytest.raises(ServerError, match=f"port {taken} is taken"):
            server.start()
        assert server.port == taken
