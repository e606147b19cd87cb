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
