"""KV handoff throughput between two processes, next to the limits measured in the same run.

    python bench/kv_transfer.py                      # 1M tokens x 890 B (0.93 GB), shm + tcp
    python bench/kv_transfer.py --tokens 131072      # quick run

Two processes play prefill (this one) and decode (a spawned child). The cache is cut into
pool blocks of --block-tokens tokens, placed in random order on each side (a real pool is
fragmented, so no two blocks merge into one region). Every figure includes the receiving
side's verification. Baselines, measured in the same run and interleaved with the transfers
(round by round, so both see the same background load on a shared machine):
- memcpy, one call: np.copyto of the whole cache between two pre-faulted buffers, one thread
  (glibc uses non-temporal stores at this size: the fastest copy this VM does); and the
  same block by block, which is what any copy of a fragmented pool can do at best;
- raw TCP: blocking sendall of 4 MiB slices into a recv_into loop on a pre-faulted buffer,
  between the same two processes.
Two more lines show what verification alone costs on this machine, with no engine around it:
memcpy + memcmp block by block (what shm does per block), and raw TCP with blocksum64 at
both ends (what tcp adds per slice).
The transports move a large batch as --streams parallel stripes (TransportConfig.streams):
for tcp a third baseline, raw TCP over as many connections, shows what that alone buys.
tcp runs twice per round: with every block's checksum sealed on the sending side, as a KV
pool seals a page when prefill fills it (the sender then reads each byte once, in the
kernel's copy), and with no seals (", no seals": the sender sums each block as it sends it).
The receiver always sums what landed.
"x baseline" is best transfer / best baseline; the target is >= 0.8. After the rounds the
decode side digests a few blocks to confirm the bytes really arrived.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import multiprocessing as mp
import os
import platform
import socket
import statistics
import threading
import time

import numpy as np
import torch

from dsflash.kvcache.transport import (ShmTransferEngine, TcpTransferEngine, TransferRequest,
                                       TransportConfig, make_compatibility_hash)
from dsflash.kvcache.transport.checksum import checksum
from dsflash.kvcache.transport.memory import same_bytes

GIB = 1 << 30
# Raw-socket baseline step: the fastest of 256 KiB / 1 / 4 MiB / one call measured here
# (3.1 / 4.9 / 5.2 / 3.7 GiB/s), kernel-default socket buffers.
RAW_CHUNK = 4 << 20
DECODE_ENGINES = ("tcp", "shm")  # order of the child's engines
RAW_STREAMS = "raw TCP, as many streams as stripes"
SUMMED_AS_SENT = ", no seals"  # the sender sums each block as it sends it


def _config(streams: int = 2) -> TransportConfig:
    return TransportConfig(compatibility_hash=make_compatibility_hash("bench", "fp8", "v1"),
                           stall_timeout_s=30.0, streams=streams)


def _block_plan(num_blocks: int, block_bytes: int, seed: int) -> list[TransferRequest]:
    rng = np.random.default_rng(seed)
    local, peer = rng.permutation(num_blocks), rng.permutation(num_blocks)
    return [TransferRequest("kv", int(a) * block_bytes, "kv", int(b) * block_bytes, block_bytes)
            for a, b in zip(local, peer)]


# ---------------------------------------------------------------- decode side (child process)


def _stream_bounds(nbytes: int, streams: int) -> list[tuple[int, int]]:
    return [(nbytes * k // streams, nbytes * (k + 1) // streams) for k in range(streams)]


def _raw_receive(conn: socket.socket, buffer: np.ndarray, start: int, end: int, summed: bool) -> None:
    with conn:
        view, got = memoryview(buffer), start
        while got < end:
            n = conn.recv_into(view[got:end], min(RAW_CHUNK, end - got))
            if n == 0:
                raise ConnectionError("sender went away")
            if summed:
                checksum(buffer[got:got + n])  # as it lands, like the transport
            got += n
        conn.sendall(b"k")


def _raw_receiver(listener: socket.socket, buffer: np.ndarray, summed: bool, streams: int) -> None:
    """One thread per connection, each filling its share of the buffer."""
    conns = [listener.accept()[0] for _ in range(streams)]
    threads = [threading.Thread(target=_raw_receive, args=(conn, buffer, start, end, summed))
               for conn, (start, end) in zip(conns, _stream_bounds(len(buffer), streams))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def decode_side(pipe, nbytes: int) -> None:
    torch.set_num_threads(1)
    engines = [TcpTransferEngine(_config()), ShmTransferEngine(_config())]
    for engine in engines:
        engine.allocate_segment("kv", nbytes)
    raw = np.empty(nbytes, np.uint8)
    raw.fill(0)  # pre-fault, as the engines' segments are
    listener = socket.create_server(("127.0.0.1", 0))
    pipe.send([e.endpoint().SerializeToString() for e in engines] + [listener.getsockname()[1]])
    while (command := pipe.recv()) != "stop":
        if command[0] == "raw":  # ("raw", summed, streams)
            _raw_receiver(listener, raw, command[1], command[2])
            pipe.send("done")
        elif command[0] in ("seal", "unseal"):  # (command, [(offset, length), ...]) on tcp's segment
            set_seals(engines[0], command[1], command[0] == "seal")
            pipe.send("done")
        elif command[0] == "digest":  # ("digest", kind index, [(offset, length), ...])
            data = engines[command[1]].segment("kv").numpy()
            pipe.send([hashlib.sha256(data[o:o + n]).hexdigest() for o, n in command[2]])
    for engine in engines:
        engine.close()


def set_seals(engine, spans: list[tuple[int, int]], sealed: bool) -> None:
    """Seal (or drop) the checksums of these blocks of segment "kv", as a KV pool does when
    a page fills: a sender then sends the sums instead of reading the bytes twice."""
    data = engine.segment("kv").numpy()
    for offset, length in spans:
        if sealed:
            engine.sealed.seal("kv", offset, data[offset:offset + length])
        else:
            engine.sealed.drop("kv", [offset])


# ---------------------------------------------------------------- prefill side (this process)


def memcpy_rate(dst: np.ndarray, src: np.ndarray, blocks: list[TransferRequest] | None,
                compared: bool = False) -> float:
    """One thread copying pre-faulted memory: in one call, or block by block as the plan
    (and then, if `compared`, checking each block with memcmp right after copying it)."""
    start = time.perf_counter()
    if blocks is None:
        np.copyto(dst, src)
    else:
        for r in blocks:
            np.copyto(dst[r.peer_offset:r.peer_offset + r.length], src[r.local_offset:r.local_offset + r.length])
            if compared:
                same_bytes(dst.ctypes.data + r.peer_offset, src.ctypes.data + r.local_offset, r.length)
    return len(src) / (time.perf_counter() - start)


def raw_tcp_rate(pipe, port: int, payload: np.ndarray, summed: bool = False, streams: int = 1) -> float:
    """sendall in RAW_CHUNK slices into the peer's recv_into loop, on fresh connections, one
    thread and one share of the payload each; `summed`: both ends also checksum every slice
    (the verification the transport adds)."""
    pipe.send(("raw", summed, streams))
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(streams)]

    def send(sock: socket.socket, start: int, end: int) -> None:
        view = memoryview(payload)
        for offset in range(start, end, RAW_CHUNK):
            stop = min(offset + RAW_CHUNK, end)
            if summed:
                checksum(payload[offset:stop])
            sock.sendall(view[offset:stop])
        assert sock.recv(1) == b"k"

    threads = [threading.Thread(target=send, args=(sock, start, end))
               for sock, (start, end) in zip(socks, _stream_bounds(len(payload), streams))]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    for sock in socks:
        sock.close()
    assert pipe.recv() == "done"
    return len(payload) / elapsed


def tcp_seals(engine, pipe, requests: list[TransferRequest], sealed: bool) -> None:
    """Seal (or unseal) every block on both sides: ours for writes, the peer's for reads."""
    set_seals(engine, [(r.local_offset, r.length) for r in requests], sealed)
    pipe.send(("seal" if sealed else "unseal", [(r.peer_offset, r.length) for r in requests]))
    assert pipe.recv() == "done"


async def batch_rate(call, peer, requests, nbytes: int) -> float:
    start = time.perf_counter()
    await call(peer, requests)
    return nbytes / (time.perf_counter() - start)


class Figures:
    """Best and median of each figure over interleaved rounds: a transfer and its baseline
    see the same background load (this VM is shared)."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = {}

    def add(self, name: str, rate: float) -> None:
        self.samples.setdefault(name, []).append(rate)

    def best(self, name: str) -> float:
        return max(self.samples[name])

    def line(self, name: str, baseline: str | None = None, label: str | None = None) -> str:
        rates = self.samples[name]
        label = name if label is None else label
        text = f"  {label:<42} {max(rates) / GIB:6.2f} GiB/s (median {statistics.median(rates) / GIB:5.2f})"
        if baseline:
            text += f"   {max(rates) / self.best(baseline):4.2f} x {baseline}"
        return text


async def measure(args, pipe, endpoints, raw_port, requests, nbytes) -> Figures:
    from dsflash.v1 import kvcache_pb2

    figures = Figures()
    source = torch.randint(0, 256, (nbytes,), dtype=torch.uint8).numpy()
    scratch = np.empty(nbytes, np.uint8)
    scratch.fill(0)  # pre-faulted, like every registered segment
    engines = {"shm": ShmTransferEngine(_config(args.streams)), "tcp": TcpTransferEngine(_config(args.streams))}
    peers = {}
    for kind in args.transports.split(","):
        engine = engines[kind]
        engine.allocate_segment("kv", nbytes).numpy()[:] = source
        endpoint = kvcache_pb2.TransportEndpoint.FromString(endpoints[kind])
        peers[kind] = await engine.connect(endpoint)
        await engine.write_batch(peers[kind], requests)  # warm connections and threads; the
        # peer's blocks now hold the bytes its read rounds send back (and seal)
    try:
        for _ in range(args.repeat):
            if "shm" in peers:
                figures.add("memcpy, one call", memcpy_rate(scratch, source, None))
                figures.add("memcpy, block by block", memcpy_rate(scratch, source, requests))
                figures.add("memcpy + memcmp, block by block", memcpy_rate(scratch, source, requests, True))
                for op in ("write", "read"):
                    call = getattr(engines["shm"], f"{op}_batch")
                    figures.add(f"shm {op}_batch", await batch_rate(call, peers["shm"], requests, nbytes))
            if "tcp" in peers:
                figures.add("raw TCP (sendall -> recv_into)", raw_tcp_rate(pipe, raw_port, source))
                figures.add("raw TCP + checksum at both ends", raw_tcp_rate(pipe, raw_port, source, True))
                if args.streams > 1:
                    figures.add(RAW_STREAMS, raw_tcp_rate(pipe, raw_port, source, streams=args.streams))
                for sealed in (True, False):  # the sender's sums sealed when the pages filled, or taken as sent
                    tcp_seals(engines["tcp"], pipe, requests, sealed)
                    for op in ("write", "read"):
                        call = getattr(engines["tcp"], f"{op}_batch")
                        figures.add(f"tcp {op}_batch{'' if sealed else SUMMED_AS_SENT}",
                                    await batch_rate(call, peers["tcp"], requests, nbytes))
        for kind in peers:  # the last write landed where the plan says
            await engines[kind].write_batch(peers[kind], requests)
            sample = requests[:: max(1, len(requests) // 8)]
            pipe.send(("digest", DECODE_ENGINES.index(kind), [(r.peer_offset, r.length) for r in sample]))
            expected = [hashlib.sha256(source[r.local_offset:r.local_offset + r.length]).hexdigest()
                        for r in sample]
            assert pipe.recv() == expected, f"{kind}: decode side holds different bytes"
    finally:
        for engine in engines.values():
            engine.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1 << 20)
    parser.add_argument("--bytes-per-token", type=int, default=890)
    parser.add_argument("--block-tokens", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--transports", default="shm,tcp")
    parser.add_argument("--streams", type=int, default=2, help="stripes per batch (TransportConfig.streams)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # two processes on a small host: no intra-op thread fights

    num_blocks = -(-args.tokens // args.block_tokens)
    block_bytes = args.block_tokens * args.bytes_per_token
    nbytes = num_blocks * block_bytes
    print(f"host: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}, torch {torch.__version__}")
    print(f"cache: {args.tokens} tokens x {args.bytes_per_token} B = {nbytes / 1e9:.3f} GB, "
          f"{num_blocks} blocks of {block_bytes} B, shuffled on both sides")

    print(f"load average before: {os.getloadavg()[0]:.2f}")

    ctx = mp.get_context("spawn")
    pipe, child_pipe = ctx.Pipe()
    child = ctx.Process(target=decode_side, args=(child_pipe, nbytes), daemon=True)
    child.start()
    tcp_endpoint, shm_endpoint, raw_port = pipe.recv()
    requests = _block_plan(num_blocks, block_bytes, seed=0)
    try:
        figures = asyncio.run(measure(args, pipe, {"tcp": tcp_endpoint, "shm": shm_endpoint},
                                      raw_port, requests, nbytes))
    finally:
        pipe.send("stop")
        child.join(30)
    print(f"load average after: {os.getloadavg()[0]:.2f}  (best of {args.repeat} interleaved rounds)")
    if "shm" in args.transports:
        print(figures.line("memcpy, one call"))
        print(figures.line("memcpy, block by block", "memcpy, one call"))
        print(figures.line("memcpy + memcmp, block by block", "memcpy, one call"))
        for op in ("write", "read"):
            print(figures.line(f"shm {op}_batch", "memcpy, one call"))
    if "tcp" in args.transports:
        print(figures.line("raw TCP (sendall -> recv_into)"))
        print(figures.line("raw TCP + checksum at both ends", "raw TCP (sendall -> recv_into)"))
        if args.streams > 1:
            print(figures.line(RAW_STREAMS, "raw TCP (sendall -> recv_into)"))
        for op in ("write", "read"):
            for name in (f"tcp {op}_batch", f"tcp {op}_batch{SUMMED_AS_SENT}"):
                print(figures.line(name, "raw TCP (sendall -> recv_into)"))
                if args.streams > 1:
                    print(figures.line(name, RAW_STREAMS, label=""))


if __name__ == "__main__":
    main()
