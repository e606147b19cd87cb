"""The gateway's view of a request for the shared metrics (role="gateway")."""

from __future__ import annotations

from ..metrics import Metrics, RequestTimer

ROLE = "gateway"


class GatewayMetrics:
    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def start(self, spec) -> "_RequestMetrics":
        return _RequestMetrics(RequestTimer(self.metrics, ROLE, len(spec.prompt)))

    def render(self):
        return self.metrics.render()


class _RequestMetrics:
    def __init__(self, timer: RequestTimer):
        self.timer = timer
        self.done = False

    def tokens(self, update) -> None:
        self.timer.tokens(len(update.tokens))

    def finished(self, choices) -> None:
        if self.done:
            return
        self.done = True
        first = choices[0] if choices else None
        cached = first.finished.usage.cached_tokens if first is not None and first.finished is not None else 0
        self.timer.finish(first.finish_reason if first is not None else "error", cached)

    def failed(self) -> None:
        if not self.done:
            self.done = True
            self.timer.finish("error")
