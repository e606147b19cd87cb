"""Carry a device machine's compiled Triton kernels to the next machine.

Every lent machine starts with an empty Triton cache, and the bench preset's first prefill
compiles for minutes: in the sixty-fifth session the prefill warm-up alone outlasted a 240 s
step on a fresh H100. A kit is that cache without what a load never reads: each kernel's
binary (.cubin), its metadata (.json) and the launchers' shared objects (.so), not the
intermediate forms (.source, .ttir, .ttgir, .llir, .ptx), which are ~90% of its bytes.

    python3 bench/device/triton_kit.py pack CACHE DIR    # at a call's end: DIR/triton-kit.tar.xz.NN
    python3 bench/device/triton_kit.py unpack DIR CACHE  # at a call's start (bench/device/env.sh)
    python3 bench/device/triton_kit.py take FROM DIR     # here, after a call: FROM's kit replaces DIR's

A kernel's group file (__grp__NAME.json) lists the files of its compile by absolute path, and
Triton takes the group as a cache hit only where every one of them exists: the kit stores the
kept ones relative to the cache and unpack makes them absolute again under the new cache.
Triton's cache keys hold its version, the backend's and the compile options, so a kit from
another Triton or GPU architecture is simply never hit (H100 and H200 are both sm_90).
"""

from __future__ import annotations

import argparse
import io
import json
import lzma
import os
import sys
import tarfile
from pathlib import Path

KEPT_SUFFIXES = (".json", ".cubin", ".so")
GROUP_PREFIX = "__grp__"
PART_BYTES = 15 << 20  # the device returns files of up to 16 MiB
KIT_NAME = "triton-kit.tar.xz"
# Kept files of at most this many bytes, the newest kernels first. xz's preset 1 packs cubins
# ~7x at ~24 MB/s here (preset 6: 9x at 3 MB/s): ~9 MB to carry, ~3 s of a call's end.
MOST_BYTES = 64 << 20


def _kernel_folders(cache: Path) -> list[Path]:
    """The cache's key folders, newest first (Triton writes each through a temporary folder:
    those are left out)."""
    folders = [p for p in cache.iterdir() if p.is_dir() and not p.name.startswith("tmp")]
    return sorted(folders, key=lambda p: p.stat().st_mtime, reverse=True)


def _kept_group(group: Path, cache: Path) -> bytes:
    """A group file with only the kept files, by paths relative to the cache."""
    children = json.loads(group.read_text())["child_paths"]
    kept = {name: os.path.relpath(path, cache) for name, path in children.items() if name.endswith(KEPT_SUFFIXES)}
    return json.dumps({"child_paths": kept}).encode()


def add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    """data as the member `name` of tar."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_parts(data: bytes, out: Path, part_bytes: int = PART_BYTES) -> list[Path]:
    """A packed kit as out/KIT_NAME.00, .01, ... of at most part_bytes each."""
    out.mkdir(parents=True, exist_ok=True)
    parts = [out / f"{KIT_NAME}.{i:02d}" for i in range(-(-len(data) // part_bytes))]
    for i, part in enumerate(parts):
        part.write_bytes(data[i * part_bytes:(i + 1) * part_bytes])
    return parts


def _parts(kit: Path) -> list[Path]:
    """A folder's kit parts, in order."""
    return sorted(kit.glob(f"{KIT_NAME}.*"))


def pack(cache: Path, out: Path, most_bytes: int = MOST_BYTES) -> list[Path]:
    """The kit of `cache` as parts of at most PART_BYTES in `out`; folders past `most_bytes` of
    kept files (the oldest) are left out. Returns the parts."""
    buffer = io.BytesIO()
    total = 0
    with tarfile.open(fileobj=buffer, mode="w:xz", preset=1) as tar:
        for folder in _kernel_folders(cache):
            files = [f for f in sorted(folder.iterdir()) if f.is_file() and f.name.endswith(KEPT_SUFFIXES)]
            total += sum(f.stat().st_size for f in files)
            if total > most_bytes:
                break
            for f in files:
                name = f.relative_to(cache).as_posix()
                if f.name.startswith(GROUP_PREFIX):
                    add_bytes(tar, name, _kept_group(f, cache))
                else:
                    tar.add(f, arcname=name)
    return write_parts(buffer.getvalue(), out)


def _opened(raw: bytes) -> tarfile.TarFile:
    """The kit its parts' bytes (joined in order) make, decompressed whole first: a missing or
    cut part fails here (lzma's checks), before anything is written."""
    return tarfile.open(fileobj=io.BytesIO(lzma.decompress(raw)), mode="r:")


def unpack(kit: Path, cache: Path) -> int:
    """Extract the kit's parts in `kit` into `cache`, its group files pointing into it.
    Returns the kernels' groups written (0 where `kit` holds no parts)."""
    parts = _parts(kit)
    if not parts:
        return 0
    groups = 0
    with _opened(b"".join(part.read_bytes() for part in parts)) as tar:
        cache.mkdir(parents=True, exist_ok=True)
        for member in tar.getmembers():
            target = (cache / member.name).resolve()
            if not member.isfile() or cache.resolve() not in target.parents:
                continue  # only plain files inside the cache
            target.parent.mkdir(parents=True, exist_ok=True)
            content = tar.extractfile(member).read()
            if target.name.startswith(GROUP_PREFIX):
                children = json.loads(content)["child_paths"]
                content = json.dumps({"child_paths": {name: str(cache.resolve() / path)
                                                      for name, path in children.items()}}).encode()
                groups += 1
            target.write_bytes(content)
    return groups


def take(source: Path, kit: Path) -> int:
    """Replace the kit in `kit` with the one in `source` (a call's $OUT/triton-kit), once it reads
    whole: the parts of the old one go first, since unpack joins every part it finds. Returns
    the new kit's members."""
    parts = _parts(source)
    if not parts:
        raise SystemExit(f"no kit in {source}")
    blobs = {part.name: part.read_bytes() for part in parts}  # read once: checked, then written
    with _opened(b"".join(blobs.values())) as tar:  # a bad part fails here, and the old kit is kept
        members = len(tar.getmembers())
    kit.mkdir(parents=True, exist_ok=True)
    for old in _parts(kit):
        old.unlink()
    for name, blob in blobs.items():
        (kit / name).write_bytes(blob)
    return members


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    packing = verbs.add_parser("pack", help="CACHE -> DIR/triton-kit.tar.xz.NN")
    packing.add_argument("cache", type=Path)
    packing.add_argument("out", type=Path)
    unpacking = verbs.add_parser("unpack", help="DIR's parts -> CACHE")
    unpacking.add_argument("kit", type=Path)
    unpacking.add_argument("cache", type=Path)
    taking = verbs.add_parser("take", help="FROM's parts replace DIR's kit")
    taking.add_argument("source", type=Path)
    taking.add_argument("kit", type=Path)
    args = parser.parse_args(argv)
    if args.verb == "pack":
        if not args.cache.is_dir():
            print(f"[triton kit] no cache at {args.cache}", file=sys.stderr)
            return
        parts = pack(args.cache, args.out)
        print(f"[triton kit] packed {args.cache}: {sum(p.stat().st_size for p in parts) / 1e6:.1f} MB "
              f"in {len(parts)} part(s) under {args.out}")
    elif args.verb == "take":
        print(f"[triton kit] {args.kit} now holds {take(args.source, args.kit)} files from {args.source}")
    else:
        print(f"[triton kit] unpacked {unpack(args.kit, args.cache)} kernels' groups into {args.cache}")


if __name__ == "__main__":
    main()
