"""In-process fan-out of ownership events: the LocalDirectory's "channel", and the place the
ResilientDirectory merges Redis events and its own degraded-mode events into one stream."""

from __future__ import annotations

import asyncio

from .base import Subscription, SubscriptionLost
from .records import OwnershipEvent

DEFAULT_MAX_QUEUED_EVENTS = 10_000

_CLOSED = object()  # queued behind the last event so a reader wakes up and stops


class QueueSubscription(Subscription):
    def __init__(self, hub: EventHub, max_queued: int):
        self._hub = hub
        # Bounded like Redis' client-output-buffer limit: a subscriber that stops reading is
        # cut off instead of growing without bound.
        self._queue: asyncio.Queue = asyncio.Queue(maxsize=max_queued + 1)
        self._max_queued = max_queued
        self._is_closed = False
        self._is_lost = False

    def _offer(self, event: OwnershipEvent) -> None:
        if self._is_closed:
            return
        if self._queue.qsize() >= self._max_queued:
            self._is_lost = True
            self._finish()
            return
        self._queue.put_nowait(event)

    def _finish(self, *, drop_pending: bool = False) -> None:
        if self._is_closed:
            return
        self._is_closed = True
        self._hub._subscribers.discard(self)
        while drop_pending and not self._queue.empty():
            self._queue.get_nowait()
        self._queue.put_nowait(_CLOSED)  # the +1 slot guarantees room

    async def __anext__(self) -> OwnershipEvent:
        item = await self._queue.get()
        if item is _CLOSED:
            self._queue.put_nowait(_CLOSED)  # later reads end too
            if self._is_lost:
                raise SubscriptionLost(f"subscriber fell more than {self._max_queued} events behind")
            raise StopAsyncIteration
        return item

    async def aclose(self) -> None:
        self._finish(drop_pending=True)


class EventHub:
    def __init__(self, max_queued: int = DEFAULT_MAX_QUEUED_EVENTS):
        self._max_queued = max_queued
        self._subscribers: set[QueueSubscription] = set()

    @property
    def num_subscribers(self) -> int:
        return len(self._subscribers)

    def subscribe(self) -> QueueSubscription:
        subscription = QueueSubscription(self, self._max_queued)
        self._subscribers.add(subscription)
        return subscription

    def publish(self, event: OwnershipEvent) -> None:
        for subscription in list(self._subscribers):
            subscription._offer(event)

    def close(self) -> None:
        for subscription in list(self._subscribers):
            subscription._finish()
