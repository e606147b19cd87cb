"""Stored responses of the Responses API (`store`, default true): what `previous_response_id`
continues from, and what GET /v1/responses/{id} returns.

Each record holds one response: its input items, the response object (whose output items are
the next turn's history) and the id it continued, so a chain is read back one record a turn
and no record repeats its predecessors. With Redis (the gateway's --redis-url) every gateway
replica reads every replica's responses, and records expire after `ttl_s`; without it they
live in this process, the least recently used dropped past a byte budget.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any

from ..kvcache.directory.keys import KeyLayout

log = logging.getLogger("dsflash.gateway")

DEFAULT_TTL_S = 30 * 24 * 3600  # as long as OpenAI keeps a stored response
DEFAULT_MEMORY_BYTES = 256 << 20
OP_TIMEOUT_S = 2.0  # a record can be megabytes (a long conversation's input)


class StoreUnavailable(RuntimeError):
    pass


@dataclass
class StoredResponse:
    id: str
    response: dict[str, Any]  # the response object, as GET returns it
    input: list[dict[str, Any]]  # this turn's input items (with ids)
    previous: str | None  # the response it continued
    conversation: str  # the router's conversation id: the next turn goes to the worker holding its cache

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str | bytes) -> StoredResponse:
        return cls(**json.loads(text))


class MemoryResponseStore:
    def __init__(self, max_bytes: int = DEFAULT_MEMORY_BYTES):
        self.max_bytes = max_bytes
        self._records: OrderedDict[str, str] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    async def put(self, record: StoredResponse) -> None:
        text = record.to_json()
        with self._lock:
            self._drop(record.id)
            self._records[record.id] = text
            self._held += len(text)
            while self._held > self.max_bytes and len(self._records) > 1:
                self._drop(next(iter(self._records)))

    async def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            text = self._records.get(response_id)
            if text is not None:
                self._records.move_to_end(response_id)
        return StoredResponse.from_json(text) if text is not None else None

    async def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._drop(response_id)

    async def close(self) -> None:
        pass

    def _drop(self, response_id: str) -> bool:
        text = self._records.pop(response_id, None)
        if text is not None:
            self._held -= len(text)
        return text is not None


class RedisResponseStore:
    def __init__(self, client, keys: KeyLayout = KeyLayout(), ttl_s: float = DEFAULT_TTL_S):
        self._client, self._keys, self._ttl_s = client, keys, int(ttl_s)

    @classmethod
    def from_url(cls, url: str, keys: KeyLayout = KeyLayout(), ttl_s: float = DEFAULT_TTL_S) -> RedisResponseStore:
        from redis.asyncio import Redis

        client = Redis.from_url(url, socket_timeout=OP_TIMEOUT_S, socket_connect_timeout=OP_TIMEOUT_S)
        return cls(client, keys, ttl_s)

    async def _call(self, what: str, op):
        try:
            return await asyncio.wait_for(op, OP_TIMEOUT_S)
        except Exception as exc:  # a down, full or read-only Redis: the caller decides what that costs
            raise StoreUnavailable(f"the response store (redis) failed to {what}: {type(exc).__name__}: {exc}") \
                from exc

    async def put(self, record: StoredResponse) -> None:
        key = self._keys.response(record.id)
        await self._call("store a response", self._client.set(key, record.to_json(), ex=self._ttl_s))

    async def get(self, response_id: str) -> StoredResponse | None:
        text = await self._call("read a response", self._client.get(self._keys.response(response_id)))
        return StoredResponse.from_json(text) if text is not None else None

    async def delete(self, response_id: str) -> bool:
        return bool(await self._call("delete a response", self._client.delete(self._keys.response(response_id))))

    async def close(self) -> None:
        await self._client.aclose()


def open_response_store(redis_url: str | None, keys: KeyLayout = KeyLayout()):
    return RedisResponseStore.from_url(redis_url, keys) if redis_url else MemoryResponseStore()
