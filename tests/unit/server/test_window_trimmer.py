"""The server's trimmer: a success is recorded into its variant's window without a look at the
window's size (`RequestWindow.succeeded`), so the server must hold every window to its bound."""

from __future__ import annotations

import asyncio

import pytest

from inferd.core.endpoints import Endpoints, EndpointSpec, Variant
from inferd.core.request_window import TRIM_INTERVAL_S, WINDOW_MAX_REQUESTS
from inferd.server.app import _trim_windows

pytestmark = pytest.mark.timeout(30)


async def test_the_server_trims_every_variants_windows_while_it_runs() -> None:
    endpoints = Endpoints()
    endpoint = endpoints.set(EndpointSpec("e", (Variant("blue", "m", "", 90), Variant("green", "m", "", 10))))
    routes = [endpoint.route(), endpoint.route(pinned="green")]
    trimmer = asyncio.create_task(_trim_windows(endpoints))
    try:
        for route in routes:
            route.succeeded([route.clock(), 0.001] * (2 * WINDOW_MAX_REQUESTS))
        windows = [endpoint.windows["blue"], endpoint.pinned_windows["green"]]
        deadline = asyncio.get_running_loop().time() + 10 * TRIM_INTERVAL_S
        while any(window.summary().requests > WINDOW_MAX_REQUESTS for window in windows):
            assert asyncio.get_running_loop().time() < deadline, "the windows were never trimmed"
            await asyncio.sleep(0.05)
        assert [window.requests_total for window in windows] == [2 * WINDOW_MAX_REQUESTS] * 2
    finally:
        trimmer.cancel()
