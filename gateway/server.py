"""`dsflash gateway`: the HTTP tier (uvicorn + FastAPI), speaking gRPC to the workers."""

from __future__ import annotations

import asyncio
import logging

import uvicorn

from ..kvcache.directory import DirectoryConfig, open_directory
from ..logs import log_event
from ..metrics import Metrics
from ..serving.peers import PeerChannels
from .app import create_app
from .endpoints import Context, GatewaySettings
from .generation import DecodeClients
from .metrics import GatewayMetrics
from .replies import ReplyMemory, SharedReplies
from .response_store import open_response_store
from .router import Router
from .tokenizer import load_tokenizer

log = logging.getLogger("dsflash.gateway")


def build_context(settings: GatewaySettings, *, redis_url: str | None = None, directory=None,
                  prefill: list[str] = (), decode: list[str] = (), tokenizer_dir: str | None = None,
                  metrics: Metrics | None = None) -> tuple[Context, PeerChannels]:
    if directory is None and redis_url:
        directory = open_directory(DirectoryConfig(redis_url=redis_url))
    channels = PeerChannels()
    ctx = Context(settings=settings, router=Router(directory, prefill, decode), tokenizer=load_tokenizer(tokenizer_dir),
                  clients=DecodeClients(channels), metrics=GatewayMetrics(metrics or Metrics()),
                  responses=open_response_store(redis_url),
                  replies=ReplyMemory(shared=SharedReplies(redis_url) if redis_url else None))
    return ctx, channels


# Open streams get this long after SIGTERM; k8s/gateway.yaml's preStop (10 s) plus this stays
# inside its 30 s termination grace.
GRACEFUL_SHUTDOWN_S = 15


async def serve_http(ctx: Context, host: str, port: int, ready: asyncio.Event | None = None) -> None:
    config = uvicorn.Config(create_app(ctx), host=host, port=port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started and not task.done():
        await asyncio.sleep(0.02)
    log_event(log, "gateway_ready", host=host, port=port)
    if ready is not None:
        ready.set()
    await task


async def run(args, settings: GatewaySettings) -> None:
    from dsflash.commands import _list

    ctx, channels = build_context(settings, redis_url=args.redis_url, prefill=list(_list(args.prefill)),
                                  decode=list(_list(args.decode)), tokenizer_dir=args.tokenizer)
    if not args.redis_url and not (args.prefill and args.decode):
        raise SystemExit("dsflash gateway needs --redis-url or both --prefill and --decode")
    try:
        await serve_http(ctx, args.host, args.port)
    finally:
        await channels.close()
        await ctx.responses.close()
        await ctx.replies.close()
