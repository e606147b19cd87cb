"""The prefill attention kernel's registers, spills (stack bytes) and shared memory per
variant, compiled for sm_90 on any machine: Triton compiles without a GPU, and its bundled
cuobjdump reads the cubin. Spills were a recurring cause of slow variants on the H200 (the
seventh session's 0.9 KB a thread); this shows them before device time is spent on timing.

    python bench/kernel_resources.py [--variants "BOTH=1,num_warps=8;QP=2,PP=2"]
"""
import argparse
import os
import pathlib
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from dsflash.model.kernels import sparse_attention as sa

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402

# one-pass prefill form at the release's shapes: faithful mode's one bf16 part, exact mode's two
DEFAULTS = dict(D=512, HB=64, KT=32, QP=1, PP=1, PTX=True, GATHERED=True, SPLITS=1, BOTH=0, num_warps=4,
                num_stages=2)
POINTERS = {"q_ptr": "*bf16", "ring16_ptr": "*i16", "win_off": "*i64", "win_soff": "*i64", "page_ptr": "*u8",
            "ent_off": "*i64", "ent_soff": "*i64", "sink_ptr": "*fp32", "o_ptr": "*fp32", "part_ml": "*fp32",
            "part_acc": "*fp32", "scale": "fp32"}
VARIANTS = "BOTH=0;BOTH=1,num_warps=8;BOTH=1;QP=2,PP=2;QP=2,PP=2,BOTH=1,num_warps=8;BOTH=1,num_warps=8,KT=16"


def resources(options: dict) -> str:
    kernel = sa._prefill_attention_kernel
    constexprs = {k: v for k, v in options.items() if k not in ("num_warps", "num_stages")}
    signature = {n: "constexpr" if n in constexprs else POINTERS.get(n, "i32") for n in kernel.arg_names}
    source = ASTSource(fn=kernel, signature=signature,
                       constexprs={(kernel.arg_names.index(n),): v for n, v in constexprs.items()})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=options["num_warps"], num_stages=options["num_stages"]))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        usage = subprocess.run([tool, "--dump-resource-usage", cubin.name], capture_output=True, text=True).stdout
    line = next((part.strip() for part in usage.splitlines() if "REG:" in part), usage[-200:])
    return f"{line.split(' SHARED')[0]} dynamic_shared={compiled.metadata.shared}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variants", default=VARIANTS, help="';'-separated variants of KEY=VALUE pairs")
    args = parser.parse_args()
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    for text, variant in zip(args.variants.split(";"), h200.variants(args.variants)):
        print(f"[resources] {text}: {resources({**DEFAULTS, **variant})}", flush=True)


if __name__ == "__main__":
    main()
