"""bench/device/triton_kit.py: a kernel compiled for sm_90 here (Triton compiles without a GPU),
packed, unpacked into another cache, is a cache hit there: Triton compiles nothing again."""

from __future__ import annotations

import io
import json
import lzma
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.support.bench_scripts import bench_script

pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[2]
triton_kit = bench_script("device/triton_kit.py", "triton_kit")

# In a process of its own: the CPU suite's TRITON_INTERPRET makes every kernel interpreted here.
_COMPILE = """
import hashlib, json
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) + 1, mask=offsets < n)

source = ASTSource(fn=add_one, signature={"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}, constexprs={(2,): 128})
compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32))
print(json.dumps({"hash": compiled.hash, "cubin": hashlib.sha256(compiled.asm["cubin"]).hexdigest()}))
"""


def _compile(cache: Path) -> dict:
    script = cache.parent / "compile_add_one.py"  # (Triton reads a kernel's source from its file)
    script.write_text(_COMPILE)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(cache), TRITON_DEFAULT_FP_FUSION="1")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _kit_of(folder: Path, files: dict[str, bytes], part_bytes: int = triton_kit.PART_BYTES) -> None:
    """A kit in folder holding `files` (names relative to a cache), cut into parts of part_bytes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as tar:
        for name, data in files.items():
            triton_kit.add_bytes(tar, name, data)
    triton_kit.write_parts(buffer.getvalue(), folder, part_bytes)


def _files(cache: Path) -> set[str]:
    return {p.relative_to(cache).as_posix() for p in cache.rglob("*") if p.is_file()}


def test_a_kit_unpacked_elsewhere_is_a_cache_hit(tmp_path):
    built, kit, moved = tmp_path / "built", tmp_path / "kit", tmp_path / "moved"
    first = _compile(built)
    parts = triton_kit.pack(built, kit)
    assert parts and all(p.stat().st_size <= triton_kit.PART_BYTES for p in parts)
    assert triton_kit.unpack(kit, moved) == 1
    unpacked = _files(moved)
    assert any(name.endswith(".cubin") for name in unpacked)
    assert not any(name.endswith((".ptx", ".ttir", ".ttgir", ".llir", ".source")) for name in unpacked)
    for group in moved.rglob(f"{triton_kit.GROUP_PREFIX}*"):
        assert all(Path(p).is_file() and moved.resolve() in Path(p).parents
                   for p in json.loads(group.read_text())["child_paths"].values())

    assert _compile(moved) == first
    assert _files(moved) == unpacked, "Triton compiled again instead of loading the kit"
    # the newest kernels first, within a kit's bytes: too few for one kernel leaves it empty
    triton_kit.pack(built, tmp_path / "small", most_bytes=1)
    assert triton_kit.unpack(tmp_path / "small", tmp_path / "none") == 0


def test_unpack_writes_nothing_outside_the_cache(tmp_path):
    assert triton_kit.unpack(tmp_path / "no-kit", tmp_path / "cache") == 0
    _kit_of(tmp_path / "kit", {"../escaped.cubin": b"x"})
    triton_kit.unpack(tmp_path / "kit", tmp_path / "cache")
    assert not (tmp_path / "escaped.cubin").exists()
    assert not os.listdir(tmp_path / "cache")


def test_take_replaces_a_kit_whole_and_keeps_it_when_the_new_one_is_broken(tmp_path):
    """A kit of two parts, then one of one part: unpack joins every part it finds, so take
    drops the old parts first; a truncated kit is refused and the kit before it kept."""
    kept = tmp_path / ".triton-kit"
    _kit_of(tmp_path / "first", {"a/k.cubin": os.urandom(4096)}, part_bytes=1024)
    assert triton_kit.take(tmp_path / "first", kept) == 1 and len(list(kept.iterdir())) > 2
    _kit_of(tmp_path / "second", {"b/k.cubin": b"x" * 10})
    assert triton_kit.take(tmp_path / "second", kept) == 1 and len(list(kept.iterdir())) == 1
    assert triton_kit.unpack(kept, tmp_path / "cache") == 0 and (tmp_path / "cache" / "b" / "k.cubin").is_file()
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / f"{triton_kit.KIT_NAME}.00").write_bytes((kept / f"{triton_kit.KIT_NAME}.00").read_bytes()[:-20])
    with pytest.raises(lzma.LZMAError):
        triton_kit.take(broken, kept)
    assert triton_kit.take(kept, tmp_path / "again") == 1  # the kit before it, whole
