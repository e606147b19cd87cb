"""`dsflash logits` writes fp32 logits [T, vocab] under the key `logits`, in every mode."""

import pytest
from safetensors.torch import load_file

from dsflash.cli import main


@pytest.mark.parametrize("mode", ["full", "incremental", "chunked:2"])
def test_logits_command_matches_golden(golden_dir, golden, tmp_path, mode):
    ids = golden[0]["input_ids"].tolist()
    out = tmp_path / "l.safetensors"
    assert main(["logits", "--checkpoint", str(golden_dir), "--ids", ",".join(map(str, ids)), "--out", str(out),
                 "--mode", mode]) == 0
    logits = load_file(str(out))["logits"]
    assert logits.shape == (len(ids), 6144)
    assert (logits - golden[0]["logits"]).abs().max() < 1e-2


@pytest.mark.parametrize("argv", [["--mode", "chunked:0"], ["--ids", "1,99999999"], ["--ids", "a,b"]])
def test_logits_command_rejects_bad_input(golden_dir, tmp_path, argv):
    base = {"--ids": "0,1,2", "--mode": "full"}
    base.update(dict(zip(argv[::2], argv[1::2])))
    args = ["logits", "--checkpoint", str(golden_dir), "--out", str(tmp_path / "x")]
    for k, v in base.items():
        args += [k, v]
    assert main(args) == 2


def test_a_gpu_forward_longer_than_the_kernels_take_is_refused_before_loading(golden_dir, tmp_path, monkeypatch):
    """The kernel path's row offsets are 32-bit (deepseek_v41.MAX_KERNEL_ROWS, lowered here):
    `dsflash logits --device cuda` refuses a longer one-shot forward or chunk with exit code 2,
    before it loads anything; chunks within it are taken."""
    import torch

    from dsflash.model import deepseek_v41

    monkeypatch.setattr(deepseek_v41, "MAX_KERNEL_ROWS", 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(deepseek_v41.DeepseekV41, "from_checkpoint",
                        classmethod(lambda cls, *a, **kw: (_ for _ in ()).throw(AssertionError("loaded"))))
    args = ["logits", "--checkpoint", str(golden_dir), "--out", str(tmp_path / "x"), "--device", "cuda",
            "--ids", "0,1,2"]
    for mode in ("full", "chunked:3"):
        assert main(args + ["--mode", mode]) == 2
    with pytest.raises(AssertionError, match="loaded"):  # (past the check: it would load)
        main(args + ["--mode", "chunked:2"])


def test_the_kernel_path_refuses_a_forward_longer_than_its_offsets_take(tiny_model, monkeypatch):
    """DeepseekV41 on the kernel path (TritonOps) raises a clear error for a forward of more rows
    than MAX_KERNEL_ROWS (lowered here) before any work; the reference path takes it."""
    import torch

    from dsflash.kvcache.state import DenseCache
    from dsflash.model import deepseek_v41
    from dsflash.model.fast_ops import TritonOps
    from dsflash.model.runner import step

    monkeypatch.setattr(deepseek_v41, "MAX_KERNEL_ROWS", 4)
    tokens = torch.arange(3, 8)
    with torch.inference_mode():
        step(tiny_model, [DenseCache(tiny_model.config)], [tokens])  # the reference path: any length
        reference = tiny_model.ops
        try:
            tiny_model.ops = TritonOps(reference.weights, device="cpu")
            cache = DenseCache(tiny_model.config)
            with pytest.raises(ValueError, match="in chunks"):
                step(tiny_model, [cache], [tokens])
            assert cache.num_tokens == 0
        finally:
            tiny_model.ops = reference
