"""`--rollout-webhook NAME=URL`: outside alarms a rollout may ask at each step (`"webhook": NAME`).

The step is POSTed as JSON (the endpoint, the candidate and baseline, the step and share, both
variants' figures over the window); the webhook answers 2xx with `{"pass": true}` to let the step
pass, or `{"pass": false, "reason": "..."}` to roll it back with that reason. A webhook that does
not answer within 10 s, or answers anything else, says no: a rollout never passes unchecked.

Only the operator names the URLs, at startup: a client that may start rollouts chooses a webhook
by name and cannot make the server call an address of its own choosing.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

TIMEOUT_S = 10.0


def parse_webhooks(entries: tuple[str, ...]) -> dict[str, str]:
    """["gate=https://alarms.internal/check", ...] → {"gate": "https://..."}."""
    webhooks = {}
    for entry in entries:
        name, separator, url = entry.partition("=")
        if not separator or not name or not url.startswith(("http://", "https://")):
            raise ValueError(f"--rollout-webhook {entry!r} must be NAME=http(s)://...")
        webhooks[name] = url
    return webhooks


class RolloutWebhooks:
    def __init__(self, urls: dict[str, str]) -> None:
        self._urls = dict(urls)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._urls))

    async def ask(self, name: str, step: dict[str, Any]) -> tuple[bool, str]:
        return await asyncio.to_thread(self._ask, self._urls[name], step)

    @staticmethod
    def _ask(url: str, step: dict[str, Any]) -> tuple[bool, str]:
        request = urllib.request.Request(
            url, json.dumps(step).encode(), {"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                answer = json.loads(response.read(64 * 1024) or b"{}")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            return False, f"it did not answer ({exc})"
        if not isinstance(answer, dict) or not isinstance(answer.get("pass"), bool):
            return False, 'its answer is not {"pass": true | false, "reason": "..."}'
        return answer["pass"], str(answer.get("reason", ""))
