"""Which workers serve a request. The gateway keeps no state a restart would lose: workers
come from Redis registrations (or static lists), conversation owners and token-prefix
matches from the ownership directory.

- prefill worker: the one with the fewest queued prefill tokens;
- decode worker: the conversation's owner if it is alive and not overloaded, else the least
  loaded. A request without a conversation id is matched to the conversation holding the
  longest cached prefix of its tokens (block hashes), so agent harnesses that send the whole
  history every turn still hit their cache.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ..decode_worker.conversations import PREFIX_BLOCK_TOKENS
from ..kvcache.directory import DirectoryUnavailable, OwnershipDirectory, WorkerInfo, WorkerRole
from ..kvcache.prefix_hash import block_hashes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Route:
    decode: str
    prefill: str
    conversation_id: str
    matched_by: str  # header | prefix | new


class NoWorkers(RuntimeError):
    pass


class Router:
    def __init__(self, directory: OwnershipDirectory | None, static_prefill: list[str] = (),
                 static_decode: list[str] = (), refresh_s: float = 0.5, overload_running: int = 64):
        self.directory = directory
        self.static = {WorkerRole.PREFILL: list(static_prefill), WorkerRole.DECODE: list(static_decode)}
        self.refresh_s, self.overload_running = refresh_s, overload_running
        self._cache: dict[WorkerRole, tuple[float, list[WorkerInfo]]] = {}

    async def workers(self, role: WorkerRole) -> list[WorkerInfo]:
        if self.static[role]:
            return [WorkerInfo(worker_id=a, role=role, address=a, incarnation="static") for a in self.static[role]]
        now = time.monotonic()
        cached = self._cache.get(role)
        if cached is None or now - cached[0] > self.refresh_s:
            try:
                listed = await self.directory.list_workers(role) if self.directory else []
            except DirectoryUnavailable:
                listed = cached[1] if cached else []
            self._cache[role] = (now, listed)
        return self._cache[role][1]

    async def route(self, conversation_id: str | None, tokens: list[int]) -> Route:
        prefills = await self.workers(WorkerRole.PREFILL)
        decodes = await self.workers(WorkerRole.DECODE)
        if not decodes:
            raise NoWorkers("no decode worker is registered")
        prefill = min(prefills, key=lambda w: w.load.num_queued_prefill_tokens).address if prefills else ""
        matched_by = "header" if conversation_id else "new"
        if not conversation_id and self.directory is not None:
            conversation_id = await self._match_prefix(tokens)
            matched_by = "prefix" if conversation_id else "new"
        conversation_id = conversation_id or f"auto-{uuid.uuid4().hex}"
        decode = await self._owner(conversation_id, decodes) or min(
            decodes, key=lambda w: w.load.num_running_requests).address
        return Route(decode, prefill, conversation_id, matched_by)

    async def _owner(self, conversation_id: str, decodes: list[WorkerInfo]) -> str | None:
        if self.directory is None:
            return None
        try:
            owner = await self.directory.find_owner(conversation_id)
        except DirectoryUnavailable:
            return None
        if owner is None:
            return None
        live = {w.worker_id: w for w in decodes}
        worker = live.get(owner.worker.worker_id)
        if worker is None or worker.load.num_running_requests >= self.overload_running:
            return None
        return worker.address

    async def _match_prefix(self, tokens: list[int]) -> str | None:
        hashes = block_hashes(tokens, PREFIX_BLOCK_TOKENS)
        if not hashes:
            return None
        try:
            match = await self.directory.match_prefix(hashes)
        except DirectoryUnavailable:
            return None
        return match.conversation_id if match else None

    async def ready(self) -> bool:
        """At least one prefill and one decode worker answer health checks as SERVING."""
        for role in (WorkerRole.PREFILL, WorkerRole.DECODE):
            workers = await self.workers(role)
            if not workers:
                return False
            if self.static[role] and not any([await _serving(w.address) for w in workers]):
                return False
        return True


async def _serving(address: str) -> bool:
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1.0)
            return reply.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.aio.AioRpcError:
        return False
