"""Where the Gluon rows kernel's time goes, in the form faithful prefill ships (fp32 queries
before RoPE in, wo_a's FP8 operand out: ROPE_IN_ROWS and ENCODE_IN_ROWS), at a 16K chunk's
shape: 64 heads, a 128-key window and 512 entries a query. Each line leaves parts out:
- SKIP (sparse_attention_gluon's ablation, in the form with three rotating row buffers that
  shipped before the fifty-seventh session): 2 the logits' wgmma, 4 the softmax, 8 the
  weighted sum's wgmma, 16 the keys' copies; 30 all four (the loop's skeleton: rows, waits,
  barriers);
- no_keys: no key at all (W = K = 0), what a program costs outside its loop: the queries'
  read and rotation, the epilogue's encode and writes;
- random_rows: every query's rows drawn from the whole key set (a gather with little reuse in
  L2) where the others take a prompt's locality (neighbouring windows, entries from a nearby
  range);
- rows_once: every tile's rows staged before the loop (sparse_attention_gluon.ROWS_ONCE), alone
  and as the loop's skeleton (SKIP=30); in_flight: with it each weighted sum left in flight into
  the next tile (PV_IN_FLIGHT), the form shipped since the fifty-seventh session; copy_ahead:
  with it each tile's keys copied a whole tile ahead instead (COPY_AHEAD), on local and random rows;
- pingpong: the warp-specialized form (sparse_attention_pingpong) on the same work, without
  its keys' copies (the loader signals without copying), with no keys and with random rows too.
Each next to the FLOP rate of the whole form's products (the measured bf16 limit: 694
TFLOP/s on an H200) and the bytes a program must move at the measured HBM read rate.

    python bench/rows_kernel_ablation.py [--queries 16384] [--only "SKIP=0,pingpong,pingpong_SKIP=16"]
"""
import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402
from rows_kernel_inputs import D, GROUPS as groups, HEADS as heads, K, KEYS as keys, W  # noqa: E402
from rows_kernel_inputs import rows_kernel_inputs  # noqa: E402
from dsflash.model.kernels import fp8_blockwise  # noqa: E402
from dsflash.model.kernels import sparse_attention_gluon as gluon_form  # noqa: E402
from dsflash.model.kernels import sparse_attention_pingpong as pingpong  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--queries", type=int, default=16384)
parser.add_argument("--skips", default="0,2,4,8,16,30")
parser.add_argument("--only", default="", help="','-separated cases to time (all where empty)")
args = parser.parse_args()
n, dev = args.queries, "cuda"
inputs = rows_kernel_inputs(n, dev)
raw, cos, sin, local, g = inputs.raw, inputs.cos, inputs.sin, inputs.local, inputs.generator
window_keys, entry_keys, sink = inputs.window_keys, inputs.entry_keys, inputs.sink
random = (torch.randint(0, keys, (n, W), device=dev, generator=g), torch.randint(0, keys, (n, K), device=dev,
                                                                                      generator=g))
none = (torch.empty(n, 0, dtype=torch.int64, device=dev),) * 2
flops = 4 * n * heads * (W + K) * D
# a program's own bytes: its fp32 queries, its operand's codes and scales (keys come through L2)
own_bytes = n * heads * D * 4 + n * heads * D * (1 + 4 / 128)


def launch(rows, skip, switches=()):
    """The case's launch, timed next: its switches set now, outside the timed calls."""
    out = fp8_blockwise.empty_operand(n, heads * D, groups, raw.device)
    if isinstance(skip, str):  # "pingpong" or "pingpong SKIP=16"
        return lambda: pingpong.prefill_attention_pingpong(raw, window_keys, rows[0], entry_keys, rows[1], sink,
                                                           D**-0.5, out, 16 if "16" in skip else 0, (cos, sin))
    gluon_form.ROWS_ONCE, gluon_form.PV_IN_FLIGHT = "rows_once" in switches, "in_flight" in switches
    gluon_form.COPY_AHEAD = "copy_ahead" in switches
    return lambda: gluon_form.prefill_attention_decoded(raw, window_keys, rows[0], entry_keys, rows[1], sink,
                                                        D**-0.5, out, skip, (cos, sin))


cases = [(f"SKIP={s}", local, int(s)) for s in args.skips.split(",")]
# every tile's rows staged before the loop (sparse_attention_gluon.ROWS_ONCE), and with it each
# weighted sum in flight into the next tile (PV_IN_FLIGHT)
cases += [("rows_once", local, 0, ("rows_once",)), ("rows_once_SKIP=30", local, 30, ("rows_once",)),
          ("in_flight", local, 0, ("rows_once", "in_flight")), ("copy_ahead", local, 0, ("rows_once", "copy_ahead")),
          ("copy_ahead_random_rows", random, 0, ("rows_once", "copy_ahead")),
          ("in_flight_random_rows", random, 0, ("rows_once", "in_flight"))]
cases += [("no_keys", none, 0), ("random_rows", random, 0)]
# the warp-specialized form (sparse_attention.PINGPONG_ROWS) beside the shipped one
cases += [("pingpong", local, "pingpong"), ("pingpong_SKIP=16", local, "pingpong SKIP=16"),
          ("pingpong_no_keys", none, "pingpong"), ("pingpong_random_rows", random, "pingpong")]
cases = [case for case in cases if not args.only or case[0] in args.only.split(",")]
for round_ in range(2):
    for name, rows, skip, *switches in cases:
        seconds = h200.cuda_time(launch(rows, skip, *switches), iters=10, warmup=2)
        print(f"[rows] round {round_} {name}: {seconds * 1e6:.0f} us ({flops / seconds / 1e12:.0f} TFLOP/s of the"
              f" whole form's products against {h200.BF16_FLOPS / 1e12:.0f}; own bytes"
              f" {own_bytes / seconds / 1e12:.2f} TB/s against {h200.HBM_BPS / 1e12:.1f})", flush=True)
