"""Reading official DeepSeek-V4.1 checkpoints: safetensors shards through model.safetensors.index.json.

Weights stay in their stored formats (FP8 e4m3 + e8m0 blocks, packed FP4 + e8m0, BF16, F32):
dequantizing is a kernel's job. `Fp8Weight.dequantize()` and friends give the exact fp32
values for reference paths. Loading is lazy and shard by shard; a `select` predicate loads
only what a tier or a rank needs. Problems are reported with the tensor or file they concern.
"""

from __future__ import annotations

import json
import logging
import mmap
import pathlib
import struct
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from safetensors import safe_open

from . import quant
from .config import ModelConfig
from .tensor_spec import DTYPE_BYTES, FP4, FP8, IGNORED_PREFIXES, ROWS_FP8, TensorSpec, model_tensors

log = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
_FLOAT_DTYPES = {"BF16", "F16", "F32"}
# Engram tables up to this size go to the GPU with the fast path (WeightStore.engram_tables_to):
# the bench preset's take 2.3 GiB; the release's 190 GiB stay in host memory.
ENGRAM_ON_DEVICE_BYTES = 4 << 30


class CheckpointError(ValueError):
    """A checkpoint that cannot be served, with every offending tensor or file named."""


@dataclass
class Fp8Weight:
    """Dense FP8 weight: e4m3 bytes [out, in] + e8m0 scale bytes per block."""

    weight: torch.Tensor  # uint8 view of the e4m3 values
    scale: torch.Tensor  # uint8 e8m0 [ceil(out/bo), ceil(in/bi)]
    block: tuple[int, int]

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.weight.shape)

    def dequantize(self) -> torch.Tensor:
        return quant.dequantize_fp8_weight(self.weight, self.scale, self.block)

    def to(self, device) -> "Fp8Weight":
        return Fp8Weight(self.weight.to(device), self.scale.to(device), self.block)


@dataclass
class Fp4Weight:
    """Routed-expert weight: packed e2m1 [out, in/2] (low nibble = even column) + e8m0 [out, in/32]."""

    packed: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return (self.packed.shape[0], self.packed.shape[1] * 2)

    def dequantize(self) -> torch.Tensor:
        return quant.dequantize_fp4_weight(self.packed, self.scale)

    def to(self, device) -> "Fp4Weight":
        return Fp4Weight(self.packed.to(device), self.scale.to(device))


@dataclass
class RowsFp8:
    """Engram table: e4m3 rows [rows, d] with one e8m0 scale per 32 values of a row."""

    weight: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.weight.shape)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Dequantize only the looked-up rows: [..., d] fp32."""
        flat = ids.reshape(-1).to(self.weight.device)
        values = quant.fp8_dequantize(self.weight[flat], self.scale[flat])
        return values.reshape(*ids.shape, -1).to(ids.device)

    def dequantize(self) -> torch.Tensor:
        return quant.fp8_dequantize(self.weight, self.scale)

    def to(self, device) -> "RowsFp8":
        return RowsFp8(self.weight.to(device), self.scale.to(device))


Weight = torch.Tensor | Fp8Weight | Fp4Weight | RowsFp8


class WeightStore:
    """Loaded tensors by logical name (FP8/FP4 names without the .weight suffix)."""

    def __init__(self, config: ModelConfig, tensors: dict[str, Weight]):
        self.config = config
        self._tensors = tensors
        self._dequantized: dict[str, torch.Tensor] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def __getitem__(self, name: str) -> Weight:
        try:
            return self._tensors[name]
        except KeyError:
            raise KeyError(f"tensor {name!r} was not loaded (not part of this tier's selection?)") from None

    def names(self) -> list[str]:
        return list(self._tensors)

    def drop(self, names: Iterable[str]) -> None:
        """Forget tensors a fast path has repacked (its own copy serves them from now on)."""
        for name in names:
            self._tensors.pop(name, None)
            self._dequantized.pop(name, None)

    def engram_tables_to(self, device: str | torch.device, limit_bytes: int) -> bool:
        """Move the Engram tables to `device` when together they take at most `limit_bytes`:
        there a decode step hashes and reads them inside its CUDA graphs, and the host never
        waits for the drafts (DeepseekV41._engram). The release's (~92 GiB each) stay mapped
        in host memory. Returns whether they moved."""
        names = [name for name, w in self._tensors.items() if isinstance(w, RowsFp8)]
        size = sum(self._tensors[name].weight.nbytes + self._tensors[name].scale.nbytes for name in names)
        if not names or size > limit_bytes:
            return False
        for name in names:
            self._tensors[name] = self._tensors[name].to(device)
        return True

    def dense(self, name: str) -> torch.Tensor:
        """Exact fp32 value of any tensor, cached: the reference path's view of the weights."""
        cached = self._dequantized.get(name)
        if cached is None:
            w = self[name]
            cached = w.float() if isinstance(w, torch.Tensor) else w.dequantize()
            self._dequantized[name] = cached
        return cached

    def drop_dense_cache(self) -> None:
        self._dequantized.clear()

    def to(self, device) -> "WeightStore":
        return WeightStore(self.config, {k: v.to(device) for k, v in self._tensors.items()})

    @property
    def nbytes(self) -> int:
        return sum(weight_nbytes(w) for w in self._tensors.values())


def weight_nbytes(w: Weight) -> int:
    """A loaded weight's bytes: a tensor's, or an FP8/FP4/Engram weight's codes and scales."""
    parts = [w] if isinstance(w, torch.Tensor) else [getattr(w, f) for f in ("weight", "packed", "scale") if hasattr(w, f)]
    return sum(p.numel() * p.element_size() for p in parts)


# ------------------------------------------------------------------ reading shard headers


def read_safetensors_header(path: pathlib.Path) -> dict[str, dict]:
    """Parse a shard's header without touching its data; checks that every tensor fits in the file."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            prefix = f.read(8)
            if len(prefix) != 8:
                raise CheckpointError(f"{path.name}: corrupt shard (file shorter than a safetensors header)")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len <= 0 or 8 + header_len > size:
                raise CheckpointError(f"{path.name}: corrupt shard (header length {header_len} exceeds the file)")
            header = json.loads(f.read(header_len))
    except FileNotFoundError:
        raise CheckpointError(f"{path.name}: shard listed in {INDEX_FILE} does not exist") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path.name}: corrupt shard (unreadable header: {exc})") from None
    header.pop("__metadata__", None)
    data_len = size - 8 - header_len
    for name, info in header.items():
        start, end = info["data_offsets"]
        want = DTYPE_BYTES.get(info["dtype"], 0) * _numel(info["shape"])
        if end > data_len or end - start != want:
            raise CheckpointError(
                f"{path.name}: corrupt shard: tensor {name} needs bytes {start}..{end} "
                f"({want} expected) but the data section has {data_len}"
            )
    return header


def _numel(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class Checkpoint:
    """An official-format checkpoint directory: config, index and shard headers, loaded lazily."""

    def __init__(self, path: str | pathlib.Path):
        self.path = pathlib.Path(path)
        if not self.path.is_dir():
            raise CheckpointError(f"{self.path}: not a checkpoint directory")
        self.config = ModelConfig.from_file(self.path)
        index_path = self.path / INDEX_FILE
        try:
            index = json.loads(index_path.read_text())
            self.weight_map: dict[str, str] = dict(index["weight_map"])
        except FileNotFoundError:
            raise CheckpointError(f"{self.path}: {INDEX_FILE} is missing") from None
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index_path.name}: unreadable index ({exc})") from None
        self._headers: dict[str, dict[str, dict]] = {}
        self._maps: dict[str, tuple[mmap.mmap, int]] = {}  # shard -> (its map, where its data starts)

    def header(self, shard: str) -> dict[str, dict]:
        if shard not in self._headers:
            self._headers[shard] = read_safetensors_header(self.path / shard)
        return self._headers[shard]

    def stored_bytes(self, key: str) -> int:
        """Bytes of one stored tensor, from its shard's header."""
        info = self.header(self.weight_map[key])[key]
        return _numel(info["shape"]) * DTYPE_BYTES[info["dtype"]]

    def spec_bytes(self, spec: TensorSpec) -> int:
        """Bytes of a logical tensor's stored entries in this checkpoint."""
        return sum(self.stored_bytes(key) for key in spec.stored(self.config.quant.weight_block))

    def _mapped(self, shard: str, key: str) -> torch.Tensor:
        """The bytes of a 1-byte tensor as a copy-on-write map of the shard: nothing is read
        up front (the kernel is asked to read ahead), and every process mapping the shard
        shares the pages."""
        info = self.header(shard)[key]
        if DTYPE_BYTES[info["dtype"]] != 1:
            raise CheckpointError(f"{shard}: {key} is {info['dtype']}, a mapped table must be 1-byte")
        if shard not in self._maps:
            with (self.path / shard).open("rb") as f:
                (header_len,) = struct.unpack("<Q", f.read(8))
                self._maps[shard] = (mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY), 8 + header_len)
        view, data_start = self._maps[shard]
        start, end = info["data_offsets"]
        view.madvise(mmap.MADV_WILLNEED, (data_start + start) // mmap.PAGESIZE * mmap.PAGESIZE,
                     end - start + (data_start + start) % mmap.PAGESIZE)
        return torch.frombuffer(view, dtype=torch.uint8, count=end - start, offset=data_start + start
                                ).view(info["shape"])

    def specs(self, select: Callable[[TensorSpec], bool] | None = None) -> list[TensorSpec]:
        return [s for s in model_tensors(self.config) if select is None or select(s)]

    def validate(self, select: Callable[[TensorSpec], bool] | None = None) -> None:
        """Raise CheckpointError naming every missing, unexpected, mis-typed or mis-shaped tensor."""
        c = self.config
        expected: dict[str, tuple[str, tuple[int, ...]]] = {}
        all_expected: set[str] = set()
        for spec in model_tensors(c):
            stored = spec.stored(c.quant.weight_block)
            all_expected.update(stored)
            if select is None or select(spec):
                expected.update(stored)
        problems: list[str] = []
        for key in sorted(expected):
            if key not in self.weight_map:
                problems.append(f"missing tensor {key}")
        for key in sorted(self.weight_map):
            if key not in all_expected and not key.startswith(IGNORED_PREFIXES):
                problems.append(f"unexpected tensor {key} (in {self.weight_map[key]})")
        shards = sorted({self.weight_map[k] for k in expected if k in self.weight_map})
        for shard in shards:
            header = self.header(shard)
            for key in [k for k in expected if self.weight_map.get(k) == shard]:
                if key not in header:
                    problems.append(f"tensor {key} is listed in {INDEX_FILE} but absent from {shard}")
                    continue
                want_dtype, want_shape = expected[key]
                dtype, shape = header[key]["dtype"], tuple(header[key]["shape"])
                if shape != tuple(want_shape):
                    problems.append(f"tensor {key} has shape {list(shape)}, expected {list(want_shape)}")
                if dtype != want_dtype and not (dtype in _FLOAT_DTYPES and want_dtype in _FLOAT_DTYPES):
                    problems.append(f"tensor {key} has dtype {dtype}, expected {want_dtype}")
        if problems:
            shown = problems[:50] + ([f"... and {len(problems) - 50} more"] if len(problems) > 50 else [])
            raise CheckpointError(f"{self.path}: {len(problems)} problem(s):\n  " + "\n  ".join(shown))

    def load(self, select: Callable[[TensorSpec], bool] | None = None, device: str | torch.device = "cpu",
             progress: bool = True) -> WeightStore:
        """Validate, then load the selected tensors shard by shard (each shard opened once),
        straight onto `device` (no host copy of a GPU's weights), the Engram tables mapped."""
        self.validate(select)
        specs = self.specs(select)
        block = self.config.quant.weight_block
        by_shard: dict[str, list[str]] = {}
        for spec in specs:
            for key in spec.stored(block):
                by_shard.setdefault(self.weight_map[key], []).append(key)
        raw: dict[str, torch.Tensor] = {}
        total = sum(self.stored_bytes(key) for keys in by_shard.values() for key in keys)
        # Engram tables (~92 GiB each in the release) stay in host memory whatever the device,
        # read a few rows per token: map them rather than copy them, so that the ranks of a
        # worker (every one needs them whole) share one page-cache copy instead of holding one each.
        mapped = {key for spec in specs if spec.fmt == ROWS_FP8 for key in spec.stored(block)}
        bar = _Progress(total, enabled=progress)
        for shard in sorted(by_shard):
            try:
                for key in [k for k in by_shard[shard] if k in mapped]:
                    raw[key] = self._mapped(shard, key)
                    bar.advance(raw[key].numel(), shard)
                with safe_open(str(self.path / shard), framework="pt", device=str(device)) as f:
                    for key in [k for k in by_shard[shard] if k not in mapped]:
                        tensor = f.get_tensor(key)
                        raw[key] = tensor
                        bar.advance(tensor.numel() * tensor.element_size(), shard)
            except CheckpointError:
                raise
            except Exception as exc:  # safetensors raises plain errors on corrupt files
                raise CheckpointError(f"{shard}: corrupt shard ({exc})") from None
        bar.close()
        return WeightStore(self.config, _assemble(specs, raw, block))


def _assemble(specs: list[TensorSpec], raw: dict[str, torch.Tensor], block: tuple[int, int]) -> dict[str, Weight]:
    out: dict[str, Weight] = {}
    for spec in specs:
        if spec.fmt == FP8:
            out[spec.name] = Fp8Weight(quant.as_uint8(raw[f"{spec.name}.weight"]), quant.as_uint8(raw[f"{spec.name}.scale"]), block)
        elif spec.fmt == FP4:
            out[spec.name] = Fp4Weight(quant.as_uint8(raw[f"{spec.name}.weight"]), quant.as_uint8(raw[f"{spec.name}.scale"]))
        elif spec.fmt == ROWS_FP8:
            out[spec.name] = RowsFp8(quant.as_uint8(raw[f"{spec.name}.weight"]), quant.as_uint8(raw[f"{spec.name}.scale"]))
        else:
            out[spec.name] = raw[spec.name]
    return out


class _Progress:
    """A one-line progress bar on stderr (a log line per shard when stderr is not a terminal)."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled = max(total, 1), 0, enabled
        self.tty = enabled and sys.stderr.isatty()
        self.start = time.monotonic()
        self.shard = None

    def advance(self, nbytes: int, shard: str) -> None:
        self.done += nbytes
        if not self.enabled:
            return
        if self.tty:
            filled = int(30 * self.done / self.total)
            sys.stderr.write(f"\rloading weights [{'#' * filled}{' ' * (30 - filled)}] "
                             f"{self.done / 2**30:.2f}/{self.total / 2**30:.2f} GiB  {shard}")
            sys.stderr.flush()
        elif shard != self.shard:
            self.shard = shard
            log.info("loading %s (%.2f/%.2f GiB)", shard, self.done / 2**30, self.total / 2**30)

    def close(self) -> None:
        if self.tty:
            sys.stderr.write(f"\rloaded {self.total / 2**30:.2f} GiB in {time.monotonic() - self.start:.1f} s"
                             + " " * 40 + "\n")


# ------------------------------------------------------------------ tier selections


def select_for_tier(tier: str) -> Callable[[TensorSpec], bool] | None:
    """Tensors a tier needs: prefill skips the DSpark stages; decode and the CLI load everything."""
    if tier == "prefill":
        return lambda spec: spec.group != "dspark"
    return None
