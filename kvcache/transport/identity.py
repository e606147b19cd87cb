"""Who an engine is, where it runs, and what it is compatible with."""

from __future__ import annotations

import hashlib
import os
import uuid

from .checksum import ALGORITHM
from .wire import PROTOCOL_VERSION


def new_engine_id() -> str:
    """One per engine incarnation: a peer restarted at the same address gets a new id, so a
    stale endpoint is refused (PeerRestarted) instead of serving another process's memory."""
    return uuid.uuid4().hex


def host_id() -> str:
    """Equal for two processes exactly when shm can work between them: same kernel boot
    (boot_id) and same network namespace (the shm control socket lives in the abstract Unix
    namespace, which is per network namespace). Two pods on one node differ; that is right,
    they cannot share memory either."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        netns = os.readlink("/proc/self/ns/net")
    except OSError:
        return f"no-shm-{uuid.uuid4().hex}"  # not Linux: never equal to anyone's
    return hashlib.sha256(f"{boot}|{netns}".encode()).hexdigest()[:32]


def make_compatibility_hash(model: str, kv_dtype: str, layout: str) -> str:
    """Hash of everything both ends must agree on for bytes to mean the same thing: the model,
    the KV dtype, the cache layout (e.g. layout.py's fingerprint), the checksum and the wire
    protocol. Peers with different hashes refuse each other (IncompatiblePeer)."""
    text = f"model={model}|kv_dtype={kv_dtype}|layout={layout}|checksum={ALGORITHM}|protocol={PROTOCOL_VERSION}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]
