"""The gateway's view of a request for the shared metrics (role="gateway")."""

from __future__ import annotations

from ..metrics import Metrics, RequestTimer
from .responses import cached_tokens

ROLE = "gateway"


class GatewayMetrics:
    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def start(self, prompt_tokens: int, n: int = 1) -> "_RequestMetrics":
        """A request of prompt_tokens in all, n choices a prompt."""
        return _RequestMetrics(RequestTimer(self.metrics, ROLE, prompt_tokens), n)

    def render(self):
        return self.metrics.render()


class _RequestMetrics:
    def __init__(self, timer: RequestTimer, n: int):
        self.timer, self.n = timer, n
        self.done = False

    def tokens(self, update) -> None:
        self.timer.tokens(len(update.tokens))

    def finished(self, choices) -> None:
        if self.done:
            return
        self.done = True
        self.timer.finish(choices[0].finish_reason if choices else "error", cached_tokens(choices, self.n))

    def failed(self) -> None:
        if not self.done:
            self.done = True
            self.timer.finish("error")
