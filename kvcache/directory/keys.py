"""Redis key layout of the ownership directory. Every key starts with one prefix, shown here
as its default `dsflash:` (configurable, so several deployments can share a Redis), and every
key has a TTL, so nothing leaks when a worker dies without cleaning up.

| key | type | contents | expires |
|---|---|---|---|
| `dsflash:{workers}:<worker_id>` | hash | `info` (JSON: id, role, address, incarnation, transports, started_at), `incarnation`, `load` (JSON), `ttl_ms` | its TTL, renewed by each heartbeat |
| `dsflash:{workers}` | zset | worker_id scored by its expiry (ms), so `list_workers` needs no SCAN; members past their score are trimmed on every write and list | at the latest member's expiry |
| `dsflash:conv:{<cid>}` | hash | `owner`, `incarnation`, `epoch`, `num_cached_tokens`, `prefix_hash`, `lease_expires_ms` | at the lease expiry (PEXPIREAT): a lapsed lease is simply gone |
| `dsflash:conv:{<cid>}:epoch` | string | the last epoch issued for the conversation, so a claim after a release or a lapsed lease still gets a larger one | `epoch_retention_s` (default 1 day) after the last claim |
| `dsflash:prefix:<block_hash>` | string | the conversation id that last recorded this block hash | the TTL given to `record_prefix` |
| `dsflash:reply:<digest>` | string | a reply's generated token ids (packed uint32) under a digest of its text, for the gateways' ReplyMemory (`gateway/replies.py`) | a day after it was written |
| `dsflash:response:<response_id>` | string | a stored response of the gateway's Responses API (JSON: `gateway/response_store.py`) | 30 days after it was stored |
| `dsflash:events` | pub/sub channel | one JSON `OwnershipEvent` per change, published by the same Lua script that makes the change, so subscribers see changes in commit order | (channels hold nothing) |

The braces are Redis Cluster hash tags: a conversation's record and epoch keys share a slot,
and so do all registry keys (a few dozen workers), so every script touches one slot only and
the layout stays legal on a cluster; for that the prefix itself must not contain braces.
Times come from Redis `TIME` inside the scripts, so every client agrees on lease expiry
whatever its own clock.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_KEY_PREFIX = "dsflash:"


@dataclass(frozen=True)
class KeyLayout:
    prefix: str = DEFAULT_KEY_PREFIX

    def __post_init__(self):
        if "{" in self.prefix or "}" in self.prefix:
            raise ValueError(f"key prefix must not contain braces (they are hash tags): {self.prefix!r}")

    def worker(self, worker_id: str) -> str:
        return f"{self.prefix}{{workers}}:{worker_id}"

    @property
    def workers(self) -> str:
        return f"{self.prefix}{{workers}}"

    def conversation(self, conversation_id: str) -> str:
        return f"{self.prefix}conv:{{{conversation_id}}}"

    def epoch(self, conversation_id: str) -> str:
        return f"{self.prefix}conv:{{{conversation_id}}}:epoch"

    def prefix_block(self, block_hash: str) -> str:
        return f"{self.prefix}prefix:{block_hash}"

    def reply(self, digest: str) -> str:
        return f"{self.prefix}reply:{digest}"

    def response(self, response_id: str) -> str:
        return f"{self.prefix}response:{response_id}"

    @property
    def events_channel(self) -> str:
        return f"{self.prefix}events"
