"""Checkpoint loading: exact decoding of the official formats, validation errors, partial loads."""

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from dsflash.cli import main
from dsflash.model.tensor_spec import model_tensors
from dsflash.model.weights import Checkpoint, CheckpointError, Fp4Weight, Fp8Weight, RowsFp8, select_for_tier

_E2M1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6]


def _raw(ckpt_dir, key):
    index = json.loads((ckpt_dir / "model.safetensors.index.json").read_text())
    with safe_open(str(ckpt_dir / index["weight_map"][key]), "pt") as f:
        return f.get_tensor(key)


def _e4m3_by_hand(byte: int) -> float:
    sign = -1.0 if byte & 0x80 else 1.0
    exp, man = (byte >> 3) & 0xF, byte & 0x7
    return sign * (man / 8 * 2.0**-6 if exp == 0 else (1 + man / 8) * 2.0 ** (exp - 7))


def test_golden_fp8_and_fp4_decode_as_the_readme_says(golden_dir):
    store = Checkpoint(golden_dir).load(progress=False)
    w = store["layers.3.attn.wq_b"]
    assert isinstance(w, Fp8Weight) and w.shape == (256, 32)
    q = _raw(golden_dir, "layers.3.attn.wq_b.weight").view(torch.uint8).numpy()
    s = _raw(golden_dir, "layers.3.attn.wq_b.scale").view(torch.uint8).numpy()
    dense = w.dequantize().numpy()
    for i, j in [(0, 0), (37, 5), (255, 31), (128, 17)]:
        assert dense[i, j] == _e4m3_by_hand(int(q[i, j])) * 2.0 ** (int(s[i // 32, j // 32]) - 127)
    e = store["layers.5.ffn.experts.3.w2"]
    assert isinstance(e, Fp4Weight) and e.shape == (64, 32)
    packed = _raw(golden_dir, "layers.5.ffn.experts.3.w2.weight").view(torch.uint8).numpy()
    scale = _raw(golden_dir, "layers.5.ffn.experts.3.w2.scale").view(torch.uint8).numpy()
    dense = e.dequantize().numpy()
    for i, j in [(0, 0), (0, 1), (63, 30), (17, 31)]:
        nib = (packed[i, j // 2] >> (4 * (j % 2))) & 0xF
        value = (-1 if nib & 8 else 1) * _E2M1[nib & 7] * 2.0 ** (int(scale[i, j // 32]) - 127)
        assert dense[i, j] == value
    rows = store["layers.1.engram.embed"]
    assert isinstance(rows, RowsFp8)
    got = rows.rows(torch.tensor([[5, 433]]))
    assert torch.equal(got[0, 1], rows.dequantize()[433])
    assert store["layers.1.attn.attn_sink"].dtype == torch.float32
    assert store["embed.weight"].dtype == torch.bfloat16


def test_tier_selection_skips_dspark(golden_dir):
    ckpt = Checkpoint(golden_dir)
    prefill = ckpt.load(select_for_tier("prefill"), progress=False)
    assert not any(n.startswith("mtp.") for n in prefill.names())
    assert "layers.11.ffn.experts.7.w1" in prefill
    with pytest.raises(KeyError, match="mtp.0.main_proj"):
        prefill["mtp.0.main_proj"]


def test_made_checkpoint_loads_and_validates(tiny_checkpoint):
    ckpt = Checkpoint(tiny_checkpoint)
    ckpt.validate()
    store = ckpt.load(progress=False)
    assert len(store.names()) == len(model_tensors(ckpt.config))
    assert store.config.vocab_size == 129280


def test_make_checkpoint_command(tmp_path):
    assert main(["make-checkpoint", str(tmp_path / "c"), "--preset", "tiny", "--seed", "3"]) == 0
    Checkpoint(tmp_path / "c").validate()
    a = load_file(str(tmp_path / "c" / "model-00001-of-00001.safetensors"))
    assert a["layers.2.attn.wq_a.weight"].dtype == torch.float8_e4m3fn
    assert a["layers.2.ffn.experts.0.w1.weight"].dtype == torch.int8
    assert a["layers.2.ffn.experts.0.w1.scale"].dtype == torch.float8_e8m0fnu


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _rewrite_shard(ckpt_dir, edit):
    shard = next(ckpt_dir.glob("model-*.safetensors"))
    tensors = load_file(str(shard))
    edit(tensors)
    save_file(tensors, str(shard))
    return shard


def test_missing_tensor_is_named(tiny_checkpoint, tmp_path):
    d = _copy(tiny_checkpoint, tmp_path / "c")
    _rewrite_shard(d, lambda t: t.pop("layers.3.attn.wkv.weight"))
    with pytest.raises(CheckpointError, match=r"layers\.3\.attn\.wkv\.weight"):
        Checkpoint(d).validate()


def test_wrong_shape_is_named(tiny_checkpoint, tmp_path):
    d = _copy(tiny_checkpoint, tmp_path / "c")
    _rewrite_shard(d, lambda t: t.update({"layers.4.attn.attn_sink": torch.zeros(5)}))
    with pytest.raises(CheckpointError, match=r"layers\.4\.attn\.attn_sink has shape \[5\], expected \[4\]"):
        Checkpoint(d).load(progress=False)


def test_unexpected_tensor_is_named(tiny_checkpoint, tmp_path):
    d = _copy(tiny_checkpoint, tmp_path / "c")
    index = json.loads((d / "model.safetensors.index.json").read_text())
    shard = _rewrite_shard(d, lambda t: t.update({"layers.0.attn.bogus": torch.zeros(2)}))
    index["weight_map"]["layers.0.attn.bogus"] = shard.name
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"unexpected tensor layers\.0\.attn\.bogus"):
        Checkpoint(d).validate()


def test_corrupt_shard_is_named(tiny_checkpoint, tmp_path):
    d = _copy(tiny_checkpoint, tmp_path / "c")
    shard = next(d.glob("model-*.safetensors"))
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=shard.name):
        Checkpoint(d).load(progress=False)
    shard.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}" + data[100:200])
    with pytest.raises(CheckpointError, match=f"{shard.name}: corrupt shard"):
        Checkpoint(d).validate()


def test_random_values_are_deterministic_per_tensor(tmp_path):
    from dsflash.model.checkpoint_writer import preset_config, random_value
    from dsflash.model.config import ModelConfig

    specs = {s.name: s for s in model_tensors(ModelConfig.from_dict(preset_config("tiny")))}
    a = random_value(specs["layers.2.attn.wq_a"], 5)
    assert torch.equal(a, random_value(specs["layers.2.attn.wq_a"], 5))
    assert not torch.equal(a, random_value(specs["layers.2.attn.wq_a"], 6))
    assert np.isfinite(a.numpy()).all()


def test_engram_tables_are_mapped_from_their_shard_not_copied(tiny_checkpoint):
    """The ranks of a worker each load the Engram tables whole: mapped, they share one copy."""
    import ctypes

    ckpt = Checkpoint(tiny_checkpoint)
    store = ckpt.load(progress=False)
    tables = [name for name in store.names() if name.endswith(".engram.embed")]
    assert tables
    for name in tables:
        shard = ckpt.weight_map[f"{name}.weight"]
        view, _ = ckpt._maps[shard]
        base = ctypes.addressof(ctypes.c_char.from_buffer(view))
        for part in (store[name].weight, store[name].scale):
            assert base <= part.data_ptr() < base + len(view)
        with safe_open(str(tiny_checkpoint / shard), framework="pt") as f:
            assert torch.equal(store[name].weight, f.get_tensor(f"{name}.weight").view(torch.uint8))
