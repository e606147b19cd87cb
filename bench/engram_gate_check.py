"""Engram's gate in one launch against torch's form on the GPU (engram_gate.FUSED): both forms
on the same inputs at each Engram site of the tiny checkpoint (their largest difference over the
largest value), then the logits of a 24-token prompt with the fused form off, off, on, on, in
faithful and exact modes: each row's largest change and the next tokens that moved. (Fifty-first
session, H100: ~4e-8 at the sites; faithful rows 0-14 the same bits, rows 15-23 moved by up to
1.8 and one next token changed, a moved FP8 step amplified by a random model; exact rows within
6.5e-4.)

    DSFLASH_GOLDEN=../shared/golden python bench/engram_gate_check.py
"""
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import torch  # noqa: E402

from dsflash.model.kernels import engram_gate  # noqa: E402
from dsflash.model.layers.engram_gate import engram_gated as torch_form  # noqa: E402
from dsflash.model.weights import Checkpoint  # noqa: E402
from tests.model.test_kernels import _g  # noqa: E402
from tests.model.test_prefill_gemms import kernel_path_prefill  # noqa: E402


def main() -> None:
    golden = pathlib.Path(os.environ.get("DSFLASH_GOLDEN", "../shared/golden")) / "v41-tiny-a"
    fused, use_fused = engram_gate.engram_gated, [False]

    def both(X, key, value, wqk, eps):
        want, got = torch_form(X, key, value, wqk, eps), fused(X, key, value, wqk, eps)
        print(f"site {tuple(X.shape)}: fused against torch {((got - want).abs().max() / want.abs().max()).item():.2e}")
        return got if use_fused[0] else want
    engram_gate.engram_gated, engram_gate.FUSED = both, True  # (the site always sees both forms)
    prompt = torch.randint(3, Checkpoint(golden).config.vocab_size, (24,), generator=_g(12))
    for act_quant in (True, False):
        prefill, logits = kernel_path_prefill(golden, act_quant), {}
        for tag in ("off", "off again", "on", "on again"):
            use_fused[0] = tag.startswith("on")
            logits[tag] = prefill(prompt, "all")
        for tag in ("off again", "on", "on again"):
            rows = (logits[tag] - logits["off"]).abs().amax(-1)
            moved = (logits[tag].argmax(-1) != logits["off"].argmax(-1)).sum().item()
            print(f"act_quant={act_quant} {tag}: each row's largest change {[round(x, 5) for x in rows.tolist()]}, "
                  f"next tokens moved {moved}")


if __name__ == "__main__":
    main()
