"""`GET /health` answers as soon as the server shows it is alive, not a second later.

SGLang 0.5.23's `health_generate` sends a one-token request and then sleeps a whole second before it first
looks whether anything came back, so every `/health` took at least 1.003 s, on plain SGLang too: a
Kubernetes liveness probe with its default 1 s timeout failed every time. This is the same probe with the
same meaning (503 while starting or shutting down, 200 once any output arrived after it was sent, 503 and
the server marked unhealthy when none arrives within SGLANG_HEALTH_CHECK_TIMEOUT), looking every 5 ms.
Answered in front of SGLang's app for GET /health and /health_generate only; everything else passes on."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

logger = logging.getLogger(__name__)

ROUTES = ("/health", "/health_generate")
POLL_SECONDS = 0.005


async def probe(path: str) -> int:
    """The status SGLang's health_generate answers, found without its one-second sleep."""
    from sglang.srt.entrypoints import http_server
    from sglang.srt.environ import envs
    from sglang.srt.managers.io_struct import EmbeddingReqInput, GenerateReqInput
    from sglang.srt.managers.tokenizer_manager import ServerStatus

    manager = http_server._global_state.tokenizer_manager
    if manager.gracefully_exit or manager.server_status == ServerStatus.Starting:
        return 503
    if envs.SGLANG_DIAG_BYPASS_HEALTH_GENERATE.get() or (
            path == "/health" and not envs.SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION.get()):
        return 200
    rid = f"{http_server.HEALTH_CHECK_RID_PREFIX}_{uuid.uuid4().hex}"
    params = {"max_new_tokens": 1, "temperature": 0.0}
    request: GenerateReqInput | EmbeddingReqInput
    if manager.is_generation:
        request = GenerateReqInput(rid=rid, input_ids=[0], sampling_params=params, log_metrics=False)
        if http_server.get_disagg().disaggregation_mode != http_server.DisaggregationMode.NULL.value:
            request.bootstrap_host, request.bootstrap_room = http_server.FAKE_BOOTSTRAP_HOST, 0
    else:
        request = EmbeddingReqInput(rid=rid, input_ids=[0], sampling_params=params, log_metrics=False)

    async def generate() -> None:
        async for _ in manager.generate_request(request, None):
            break

    task = asyncio.create_task(generate())
    sent = time.time()
    try:
        while time.time() < sent + http_server.HEALTH_CHECK_TIMEOUT:
            await asyncio.sleep(POLL_SECONDS)
            if manager.last_receive_tstamp > sent:  # any output since: the scheduler and detokenizer run
                manager.server_status = ServerStatus.Up
                return 200
        logger.error("Health check failed: no response from the scheduler or detokenizer for %s s",
                     http_server.HEALTH_CHECK_TIMEOUT)
        manager.server_status = ServerStatus.UnHealthy
        return 503
    finally:
        task.cancel()
        manager.rid_to_state.pop(rid, None)


class FastHealthMiddleware:
    """Pure ASGI: one comparison per request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "GET" or scope.get("path") not in ROUTES:
            return await self.app(scope, receive, send)
        status = await probe(scope["path"])
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})


def install() -> None:
    """Put the probe in front of SGLang's HTTP app (once), before the app starts."""
    from sglang.srt.entrypoints.http_server import app

    if not any(m.cls is FastHealthMiddleware for m in app.user_middleware):
        app.add_middleware(FastHealthMiddleware)
