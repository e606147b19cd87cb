"""Engram n-gram hashing: token ids -> rows of the per-layer hash tables.

A token is first mapped to a "compressed id" (tokens whose normalized text is equal share
one id), then every position hashes the 2..N-grams ending at it: a rolling XOR of
compressed ids times per-layer odd multipliers, reduced modulo one prime per
(n-gram size, head). Each (n-gram, head) owns a disjoint row range of the layer's table.
The look-back needs the previous N-1 token ids, across chunks and requests: callers pass
them explicitly (`history`), which is part of a request's cache state.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pathlib
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from .config import ModelConfig
from .device import tables_to_device, to_device

log = logging.getLogger(__name__)

DEAD = -1  # before the sequence start (or an image token): blocks longer n-grams


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    f = 3
    while f * f <= n:
        if n % f == 0:
            return False
        f += 2
    return True


@dataclass(frozen=True)
class EngramLayout:
    """primes[layer][ngram-2][head]; offsets[layer][(ngram-2)*heads + head] (row start of that range)."""

    primes: tuple[tuple[tuple[int, ...], ...], ...]
    offsets: tuple[tuple[int, ...], ...]

    @property
    def table_rows(self) -> tuple[int, ...]:
        return tuple(sum(p for per in layer for p in per) for layer in self.primes)

    @classmethod
    def build(cls, num_layers: int, max_ngram: int, n_heads: int, vocab_size: int) -> "EngramLayout":
        # Primes are drawn in order, never reused across layers; the search cursor restarts at
        # vocab_size - 1 for every n-gram size.
        seen: set[int] = set()
        primes = []
        for _ in range(num_layers):
            per_ngram = []
            for _ in range(max_ngram - 1):
                cursor, sizes = vocab_size - 1, []
                for _ in range(n_heads):
                    cursor += 1
                    while not _is_prime(cursor) or cursor in seen:
                        cursor += 1
                    seen.add(cursor)
                    sizes.append(cursor)
                per_ngram.append(tuple(sizes))
            primes.append(tuple(per_ngram))
        offsets = []
        for layer in primes:
            row, total = [], 0
            for p in (p for per in layer for p in per):
                row.append(total)
                total += p
            offsets.append(tuple(row))
        return cls(tuple(primes), tuple(offsets))


def hash_multipliers(layer_ids: tuple[int, ...], max_ngram: int, compressed_vocab: int) -> torch.Tensor:
    """[layers, max_ngram] odd int64 multipliers from numpy's PCG64 seeded 10007 * layer_id."""
    bound = max(1, (np.iinfo(np.int64).max // compressed_vocab) // 2)
    rows = []
    for layer in layer_ids:
        values = np.random.default_rng(10007 * layer).integers(0, bound, size=(max_ngram,), dtype=np.int64)
        rows.append(torch.from_numpy(values * 2 + 1))
    return torch.stack(rows)


# ------------------------------------------------------------------ compressed token map


def _normalizer():
    from tokenizers import Regex, normalizers

    sentinel = "\ue000"  # keeps a token that is exactly one space from collapsing to ""
    return normalizers.Sequence([
        normalizers.NFKC(), normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase(),
        normalizers.Replace(Regex(r"[ \t\r\n]+"), " "), normalizers.Replace(Regex(r"^ $"), sentinel),
        normalizers.Strip(), normalizers.Replace(sentinel, " "),
    ])


def build_compressed_map(tokenizer_json: pathlib.Path) -> np.ndarray:
    """token id -> compressed id, over the whole tokenizer (not just the model's vocab)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    norm = _normalizer()
    size = tok.get_vocab_size(with_added_tokens=True)
    keys: dict[str, int] = {}
    out = np.zeros(size, dtype=np.int64)
    for token_id in range(size):
        text = tok.decode([token_id], skip_special_tokens=False)
        if "\ufffd" in text:
            key = tok.id_to_token(token_id)  # partial UTF-8 byte token: keyed by its raw form
        else:
            key = norm.normalize_str(text) or text
        out[token_id] = keys.setdefault(key, len(keys))
    return out


def _cache_dir() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "dsflash"


@lru_cache(maxsize=4)
def compressed_map(tokenizer_json: str) -> np.ndarray:
    """The map, cached on disk by the tokenizer file's hash (building it takes seconds)."""
    path = pathlib.Path(tokenizer_json)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    cache = _cache_dir() / f"engram-map-{digest}.npy"
    if cache.exists():
        return np.load(cache)
    table = build_compressed_map(path)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp.npy")
        np.save(tmp, table)
        os.replace(tmp, cache)
    except OSError as exc:  # a read-only home only costs the rebuild next time
        log.warning("cannot cache the Engram token map in %s: %s", cache, exc)
    return table


# ------------------------------------------------------------------ hashing


class EngramHasher:
    """Hash ids of every engram layer for a run of tokens, given the N-1 ids before them."""

    def __init__(self, config: ModelConfig, token_map: np.ndarray):
        c = config
        self.num_layers = len(c.engram_layers)
        self.max_ngram = c.engram_max_ngram_size
        self.context = self.max_ngram - 1
        distinct = int(token_map.max()) + 1 if len(token_map) else 0
        if distinct != c.engram_compressed_vocab_size:
            raise ValueError(
                f"the tokenizer gives {distinct} compressed Engram ids but the config says "
                f"engram_compressed_vocab_size = {c.engram_compressed_vocab_size}: every hash would differ"
            )
        layout = EngramLayout.build(self.num_layers, self.max_ngram, c.engram_n_heads, c.engram_vocab_size)
        if layout.table_rows != tuple(c.engram_num_embeddings):
            raise ValueError(
                f"engram_num_embeddings {list(c.engram_num_embeddings)} does not match the prime layout "
                f"{list(layout.table_rows)} derived from engram_vocab_size / engram_n_heads"
            )
        # numpy, not torch: a decode step hashes a few rows, and numpy's per-op cost on small
        # arrays is a fraction of torch's (0.25 ms a batch-1 step in torch on the H200's host)
        self.token_map = np.asarray(token_map, dtype=np.int64)
        self.pad = int(token_map[c.engram_pad_token_id])
        self.primes = np.array(layout.primes, dtype=np.int64)  # [L, N-1, heads]
        self.offsets = np.array(layout.offsets, dtype=np.int64)  # [L, cols]
        self.multipliers = hash_multipliers(c.engram_layers, self.max_ngram, c.engram_compressed_vocab_size).numpy()
        self._tables: dict[torch.device, dict[str, torch.Tensor]] = {}

    def __call__(self, tokens: torch.Tensor, history: list[int]) -> torch.Tensor:
        """tokens [S] (new ids), history = the ids right before them (may be shorter than N-1
        at the sequence start). Returns [S, layers, cols] int64 row ids."""
        return self.many([(tokens, history)])

    def many(self, runs: list[tuple[torch.Tensor, list[int]]]) -> torch.Tensor:
        """__call__ of each (tokens, history), concatenated. Runs of one length (a decode
        step's blocks) hash in one pass: per run, the ~25 small host ops took 2 ms a step for 8
        requests on the H200's host (bench/decode_timeline.py), before the forward could start."""
        n = runs[0][0].shape[0]
        if any(tokens.shape[0] != n for tokens, _ in runs):
            return torch.cat([self.many([run]) for run in runs])
        rows = []
        for tokens, history in runs:
            before = list(history)[-self.context:] if self.context else []
            rows.append([DEAD] * (self.context - len(before)) + before + tokens.to("cpu", torch.int64).tolist())
        raw = np.array(rows, dtype=np.int64)  # [R, N-1 + S]: the look-back, then the tokens
        seq = np.where(raw == DEAD, raw, self.token_map[raw.clip(min=0)])
        ids, blocked = [], np.zeros((len(runs), n), dtype=bool)
        for shift in range(self.max_ngram):
            source = seq[:, self.context - shift: self.context - shift + n]
            blocked = blocked | (source == DEAD)
            ids.append(np.where(blocked, self.pad, source))
        grams = np.stack(ids, axis=-1)  # [R, S, N]
        products = grams[..., None, :] * self.multipliers  # [R, S, L, N] (int64 products wrap, as in torch)
        rolling, hashes = products[..., 0], []
        for i in range(1, self.max_ngram):
            rolling = rolling ^ products[..., i]
            hashes.append(rolling[..., None] % self.primes[:, i - 1])  # numpy's % takes the divisor's sign
        hashed = np.concatenate(hashes, axis=-1) + self.offsets  # [R, S, L, cols]
        return torch.from_numpy(hashed.reshape(len(runs) * n, *self.offsets.shape))

    def look_back(self, runs) -> tuple[np.ndarray, np.ndarray]:
        """For hashing on the device (on_device): per row of the runs' flat batch and per shift s
        (the token s places back) [T, N], the batch row that holds that token, or -1 with its id
        in `known` (the history's; DEAD before the sequence start). Built from the runs' lengths
        and histories alone: their tokens may still be on the device (a decode step's drafts)."""
        total = sum(run.n for run in runs)
        rows = np.full((total, self.max_ngram), -1, dtype=np.int64)
        known = np.full((total, self.max_ngram), DEAD, dtype=np.int64)
        for run in runs:
            before = list(run.history)[-self.context:] if self.context else []
            lead = np.array([DEAD] * (self.context - len(before)) + before, dtype=np.int64)
            at = np.arange(run.n)[:, None] - np.arange(self.max_ngram)  # [n, N] index in the run; < 0: look-back
            rows[run.rows] = np.where(at >= 0, run.offset + at, -1)
            known[run.rows] = np.where(at >= 0, DEAD, lead[(at + self.context).clip(0, self.context - 1)])
        return rows, known

    def on_device(self, tokens: torch.Tensor, rows: torch.Tensor, known: torch.Tensor, slot: int) -> torch.Tensor:
        """Engram layer `slot`'s hash ids [T, cols] from the flat token ids [T] and look_back's
        tables, in torch ops on their device (a CUDA graph's at decode): many's ids bit for bit
        (int64 products wrap alike; torch's remainder takes the divisor's sign as numpy's %)."""
        t = self._on(tokens.device)
        raw = torch.where(rows >= 0, tokens[rows.clamp(min=0)], known)  # [T, N]
        blocked = (raw == DEAD).cumsum(-1) > 0  # a dead id blocks every longer n-gram
        grams = torch.where(blocked, self.pad, t["token_map"][raw.clamp(min=0)])
        products = grams * t["multipliers"][slot]
        rolling, hashes = products[:, 0], []
        for i in range(1, self.max_ngram):
            rolling = rolling ^ products[:, i]
            hashes.append(torch.remainder(rolling[:, None], t["primes"][slot, i - 1]))
        return torch.cat(hashes, -1) + t["offsets"][slot]

    def _on(self, device: torch.device) -> dict[str, torch.Tensor]:
        """The hashing's tables on `device`, moved once."""
        if device not in self._tables:
            self._tables[device] = {name: torch.from_numpy(getattr(self, name)).to(device)
                                    for name in ("token_map", "multipliers", "primes", "offsets")}
        return self._tables[device]


def engram_table_rows(config_like: dict) -> list[int]:
    """Rows per engram layer for a text_config dict (used when writing checkpoints)."""
    layout = EngramLayout.build(len(config_like["engram_layer_ids"]), config_like["engram_max_ngram_size"],
                                config_like["engram_n_heads"], config_like["engram_vocab_size"])
    return list(layout.table_rows)


class RunHashes:
    """A forward's Engram hash ids, made where a site needs them: on the host (`ids`, numpy) for
    a table whose rows are looked up on the host, or on the device from `device_inputs` for a
    table on the GPU (then the host never waits for a decode step's drafts: SeqRun.host)."""

    def __init__(self, hasher: EngramHasher, runs, tokens: torch.Tensor):
        self.hasher, self.runs, self.tokens = hasher, runs, tokens  # tokens: batch.pack's flat ids
        self._ids: torch.Tensor | None = None
        self._inputs: dict[torch.device, tuple[torch.Tensor, ...]] = {}

    @property
    def ids(self) -> torch.Tensor:
        """[T, layers, cols] on the host, computed at the first call."""
        if self._ids is None:
            self._ids = self.hasher.many([(run.host_tokens(), run.history) for run in self.runs])
        return self._ids

    def device_inputs(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(flat token ids [T], look_back's rows and known [T, N]) on `device`, for on_device."""
        if device not in self._inputs:
            self._inputs[device] = ((to_device(self.tokens, device).long(),)
                                    + tables_to_device(device, *self.hasher.look_back(self.runs)))
        return self._inputs[device]
