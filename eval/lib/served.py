"""The server an eval command measures: one it starts, or one already running (`--url`).

Every command that starts servers takes `--url URL`: it then sends its workload to that server
and starts none, whatever systems or modes it was asked for (each runs on that one server, with
the flags it was started with). That is for trying a command, and for the smoke tests, which run
every command against one shared server (tests/tooling/test_commands.py); figures that compare systems
need the server each command starts itself.
"""

import requests

from sglang_mepic.process.server_process import ServerProcess

HELP = ("send the workload to the server already running at URL and start none: every system asked for runs on "
        "it, with the flags it was started with (for trying the command and for smoke tests, not for figures "
        "that compare systems)")


class Running:
    """A server someone else started: it is neither started nor stopped here, and its log is not read."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")

    def __enter__(self) -> "Running":
        try:
            healthy = requests.get(self.url + "/health", timeout=30).status_code == 200
        except requests.RequestException:
            healthy = False
        if not healthy:
            raise SystemExit(f"--url {self.url}: no server answers /health there")
        return self

    def __exit__(self, *exc) -> None:
        return None

    def log(self) -> str:
        return ""


def add_url(parser) -> None:
    parser.add_argument("--url", default=None, metavar="URL", help=HELP)


def server(url: str | None, model: str, *args: str, **kwargs):
    """A context manager giving the server: `url`'s, or a fresh ServerProcess(model, *args, **kwargs)."""
    return Running(url) if url else ServerProcess(model, *args, **kwargs)
