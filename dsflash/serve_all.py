"""`dsflash serve`: one gateway, one prefill and one decode worker on loopback, in one process.

The workers share one copy of the weights and talk to the gateway and to each other over
real gRPC and a real KV transport (shm/tcp), exactly as separate processes would; without
--redis-url the ownership directory is in-process.
"""

from __future__ import annotations

import asyncio
import logging
import time

from .commands import default_checkpoint
from .kvcache.directory import DirectoryConfig, LocalDirectory, open_directory
from .logs import log_event
from .metrics import Metrics
from .model.parallel import SINGLE
from .serving.ranks import load_model
from .serving.worker import WorkerSettings

log = logging.getLogger("dsflash.serve")


async def serve(args) -> None:
    from .decode_worker.server import DecodeWorker
    from .gateway.endpoints import GatewaySettings
    from .gateway.server import build_context, serve_http
    from .prefill_worker.server import PrefillWorker

    began = time.monotonic()
    checkpoint = str(args.checkpoint or default_checkpoint())
    directory = open_directory(DirectoryConfig(redis_url=args.redis_url)) if args.redis_url else LocalDirectory()
    # the workers' own loader: on a GPU it switches to the Triton kernels and CUDA graphs
    model = load_model(checkpoint, "all", args.device, SINGLE, progress=True, act_quant=args.act_quant)
    common = dict(checkpoint=checkpoint, host="127.0.0.1", redis_url=args.redis_url, device=args.device,
                  pool_bytes=256 << 20, max_requests=16, act_quant=args.act_quant)
    metrics = Metrics()  # one registry: the gateway's /metrics shows every tier (role label)
    # port 0: the kernel picks a port no other server holds (a port chosen here could be taken
    # before the bind)
    prefill = PrefillWorker(WorkerSettings(role="prefill", port=0, **common), directory, model, metrics)
    decode = DecodeWorker(WorkerSettings(role="decode", port=0, **common), directory, model, metrics)
    await prefill.start()
    await decode.start()
    keys = tuple(k.strip() for k in (args.api_key or "").split(",") if k.strip())
    ctx, channels = build_context(GatewaySettings(api_keys=keys, reasoning_field=args.reasoning_field),
                                  directory=directory, redis_url=args.redis_url, tokenizer_dir=checkpoint,
                                  metrics=metrics)
    ready = asyncio.Event()
    http = asyncio.create_task(serve_http(ctx, args.host, args.port, ready))
    await ready.wait()
    log_event(log, "serve_ready", seconds=round(time.monotonic() - began, 1), url=f"http://{args.host}:{args.port}",
              checkpoint=checkpoint, prefill=prefill.runtime.address, decode=decode.runtime.address)
    auth = f" -H 'Authorization: Bearer {keys[0]}'" if keys else ""
    log.info("try: curl http://%s:%d/v1/chat/completions%s -H 'Content-Type: application/json' "
             "-d '{\"model\": \"deepseek-v4.1-flash\", \"max_tokens\": 16, "
             "\"messages\": [{\"role\": \"user\", \"content\": \"Hello!\"}]}'", args.host, args.port, auth)
    try:
        await http
    finally:
        await channels.close()
        await ctx.responses.close()
        await ctx.replies.close()
        await decode.close()
        await prefill.close()


def main(args) -> int:
    asyncio.run(serve(args))
    return 0
