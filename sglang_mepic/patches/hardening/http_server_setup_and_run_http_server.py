"""Put the request-shape check (sglang_mepic.hardening.body_types) and the answer for routes SGLang did not
start (sglang_mepic.hardening.unserved_routes) in front of SGLang's HTTP app, add the route that registers
documents (sglang_mepic.frontend.known_routes), answer validation errors without the server's source path
(sglang_mepic.hardening.validation_errors) and refuse admin bodies that are not JSON objects
(sglang_mepic.hardening.admin_bodies), and answer `/health` without SGLang's one-second sleep
(sglang_mepic.hardening.health_probe), before it starts."""

from __future__ import annotations

from typing import Any

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.frontend import known_routes
from sglang_mepic.hardening import admin_bodies, body_types, health_probe, unserved_routes, validation_errors

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.entrypoints.http_server._setup_and_run_http_server"
HOOK_TYPE = HookType.BEFORE


def hook(*args: Any, **kwargs: Any) -> None:
    body_types.install()
    unserved_routes.install()
    known_routes.install()
    validation_errors.install()
    admin_bodies.install()
    health_probe.install()
