"""What the gateway adds per token over a direct gRPC Generate stream, and how many tokens/s
one gateway process relays.

A scripted decode worker (no model) and the real gateway run in their own processes; this
process is the client. The worker records when it sends each token (CLOCK_MONOTONIC, shared
by processes on one host); the client records when each token arrives, once straight over
gRPC and once through the gateway as SSE. Latency per token = arrival - send; the gateway's
share is the difference of the medians. Relay throughput: several concurrent streams of
tokens sent back to back. Target (issue 7): <= 0.3 ms p50 added per token. `--endpoint`
picks the stream: /v1/completions' chunks, or the typed events of /v1/responses or
/v1/messages (a chat prompt, thinking off, each token an output_text.delta or a
content_block_delta).

    python bench/gateway_overhead.py [--tokens 2000] [--interval-ms 2] [--streams 8] [--endpoint messages]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import time

import grpc
import httpx

from dsflash.v1 import worker_pb2, worker_pb2_grpc


def _backend(conn, tokens: int, interval_s: float) -> None:
    """The scripted decode worker (its own process, as a real worker would be)."""
    from dsflash.gateway.tokenizer import load_tokenizer
    from dsflash.serving.scripted import ScriptedDecode

    word = load_tokenizer().encode_text(" word")[0]
    sends: dict[str, list[int]] = {}
    state = {"paced": True}  # paced: one token per message every interval; else 16 per message, no pause

    def script(request):
        return ([[word]] * tokens if state["paced"] else [[word] * 16] * (tokens // 16)), "length"

    backend = ScriptedDecode(script, delay_s=interval_s,
                             on_send=lambda rid, i: sends.setdefault(rid, []).append(time.monotonic_ns()))

    async def main():
        server = grpc.aio.server()
        worker_pb2_grpc.add_DecodeServicer_to_server(backend, server)
        conn.send(f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}")
        await server.start()
        while True:
            await asyncio.sleep(0.05)
            if conn.poll():
                rid = conn.recv()
                if rid is None:
                    return
                if rid == "unpaced":
                    backend.delay_s, state["paced"] = 0.0, False
                    continue
                conn.send(sends.get(rid, []))

    asyncio.run(main())


def _gateway(conn, decode: str) -> None:
    """The real gateway in its own process."""
    from dsflash.gateway.endpoints import GatewaySettings
    from dsflash.gateway.server import build_context, serve_http
    from dsflash.serving.worker import free_port

    async def main():
        ctx, _ = build_context(GatewaySettings(), prefill=["127.0.0.1:1"], decode=[decode])
        port = free_port()
        ready = asyncio.Event()
        task = asyncio.create_task(serve_http(ctx, "127.0.0.1", port, ready))
        await ready.wait()
        conn.send(port)
        await task

    asyncio.run(main())


def _direct(decode: str, rid: str, max_tokens: int) -> list[int]:
    arrivals = []
    with grpc.insecure_channel(decode) as channel:
        stub = worker_pb2_grpc.DecodeStub(channel)
        request = worker_pb2.GenerateRequest(request_id=rid, token_ids=[1, 2],
                                             sampling=worker_pb2.SamplingParams(max_tokens=max_tokens))
        for message in stub.Generate(request):
            if message.HasField("chunk"):
                arrivals += [time.monotonic_ns()] * len(message.chunk.token_ids)
    return arrivals


def _request(endpoint: str, max_tokens: int) -> tuple[str, dict]:
    """The streamed request's path and body."""
    if endpoint == "responses":
        return "/v1/responses", {"input": "hi", "max_output_tokens": max_tokens, "stream": True,
                                 "thinking": {"type": "disabled"}}
    if endpoint == "messages":
        return "/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
                                "stream": True}
    return "/v1/completions", {"prompt": [1, 2], "max_tokens": max_tokens, "stream": True}


def _carries_text(data: dict) -> bool:
    if "choices" in data:
        return bool(data["choices"] and data["choices"][0]["text"])
    return data.get("type") in ("response.output_text.delta", "content_block_delta")


def _via_gateway(url: str, max_tokens: int, endpoint: str) -> tuple[str, list[int]]:
    arrivals = []
    path, body = _request(endpoint, max_tokens)
    with httpx.stream("POST", f"{url}{path}", json=body, timeout=120) as r:
        rid = r.headers["x-request-id"]  # (the workers' request id, before the choice's number)
        for line in r.iter_lines():
            if line.startswith("data: {") and _carries_text(json.loads(line[6:])):
                arrivals.append(time.monotonic_ns())
    return rid, arrivals


def _relay_rate(url: str, streams: int, tokens: int, endpoint: str) -> float:
    async def one(client):
        path, body = _request(endpoint, tokens)
        n = 0
        async with client.stream("POST", f"{url}{path}", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    n += 1
        return n

    async def main():
        async with httpx.AsyncClient(timeout=120) as client:
            began = time.perf_counter()
            await asyncio.gather(*[one(client) for _ in range(streams)])
            return time.perf_counter() - began

    elapsed = asyncio.run(main())
    return streams * (tokens // 16) * 16 / elapsed


def _latencies(sends: list[int], arrivals: list[int]) -> list[float]:
    n = min(len(sends), len(arrivals))
    return [(arrivals[i] - sends[i]) / 1e6 for i in range(10, n)]  # skip the warm-up tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--interval-ms", type=float, default=2.0)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--endpoint", choices=["completions", "responses", "messages"], default="completions")
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    to_backend, backend_end = ctx.Pipe()
    backend = ctx.Process(target=_backend, args=(backend_end, args.tokens, args.interval_ms / 1000), daemon=True)
    backend.start()
    decode = to_backend.recv()
    to_gateway, gateway_end = ctx.Pipe()
    gateway = ctx.Process(target=_gateway, args=(gateway_end, decode), daemon=True)
    gateway.start()
    url = f"http://127.0.0.1:{to_gateway.recv()}"
    try:
        # a first stream through each path, untimed: the first request's one-time work (imports,
        # first encodes) held ~60 tokens back by up to 140 ms and made the p99
        _direct(decode, "warm-up-direct", args.tokens)
        _via_gateway(url, args.tokens, args.endpoint)
        direct_arrivals = _direct(decode, "paced-direct", args.tokens)
        to_backend.send("paced-direct")
        direct = _latencies(to_backend.recv(), direct_arrivals)
        rid, gw_arrivals = _via_gateway(url, args.tokens, args.endpoint)
        to_backend.send(f"{rid}-0")
        via = _latencies(to_backend.recv(), gw_arrivals)
        to_backend.send("unpaced")
        rate = _relay_rate(url, args.streams, args.tokens, args.endpoint)
    finally:
        to_backend.send(None)
        gateway.terminate()
        backend.join(5)
    p50_direct, p50_via = statistics.median(direct), statistics.median(via)
    q = lambda xs, p: sorted(xs)[int(p * (len(xs) - 1))]  # noqa: E731
    print(f"per-token latency, {args.tokens} tokens one per message every {args.interval_ms} ms "
          f"(/v1/{args.endpoint}):")
    print(f"  direct gRPC   p50 {p50_direct:.3f} ms  p99 {q(direct, 0.99):.3f} ms")
    print(f"  via gateway   p50 {p50_via:.3f} ms  p99 {q(via, 0.99):.3f} ms")
    print(f"  added by the gateway: p50 {p50_via - p50_direct:.3f} ms per token (target <= 0.300 ms)")
    print(f"relay throughput: {rate:,.0f} tokens/s through one gateway process ({args.streams} concurrent streams, "
          f"16 tokens per message)")


if __name__ == "__main__":
    main()
