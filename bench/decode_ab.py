"""Decode steps (or, with --prefill N, prefills of N tokens) with a module switch at each of its
values, alternated in one process on one machine (lent machines differ by more than most
changes: compare within a run only). The model is built once; each round sets the switch and
starts new CUDA graphs, so every kernel the switch reaches is compiled and captured afresh
(a prefill's first round warms each value's kernels: compare the later rounds).

    python bench/decode_ab.py dsflash.model.kernels.common.SCALE_WORDS True False \\
        [--batches 1,8] [--context 4096] [--rounds 2] [--act-quant] [--budget-s 300]
    python bench/decode_ab.py dsflash.model.kernels.sparse_attention.BF16_PREFILL_TILES "{}" "{'KT': 64}" \\
        --prefill 32768 --act-quant --rounds 3
"""
import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("switch", help="module.attribute, e.g. dsflash.model.kernels.common.SCALE_WORDS")
    parser.add_argument("values", nargs="+", help="Python literals, in the order each round takes them")
    parser.add_argument("--batches", default="1")
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prefill", type=int, default=0, help="time prefills of this many tokens, not decode")
    parser.add_argument("--chunk", type=int, default=8192, help="a prefill step's tokens")
    parser.add_argument("--act-quant", action="store_true")
    h200.add_no_warm_up(parser)
    parser.add_argument("--budget-s", type=float, default=300.0)
    args = parser.parse_args()
    module, attribute, values = h200.module_switch(args.switch, args.values)
    h200.DEADLINE[0] = time.monotonic() + args.budget_s
    h200.watch_compiles()  # a prefill's record counts the compiles inside it; its budget leaves them out
    model, _ = h200.build_model(fast=True, preset="bench", act_quant=args.act_quant)
    weights = h200.hold_experts_once(model)
    batches = [int(b) for b in args.batches.split(",")]
    for round_ in range(args.rounds):
        for value in values:
            setattr(module, attribute, value)
            h200.new_graphs(model)
            if args.prefill:
                h200.prefill(model, [args.prefill], f"prefill_{attribute}={value}_round{round_}",
                             warm_first=round_ == 0 and not args.no_warm_up, chunk=args.chunk)
            else:
                h200.decode(model, weights, batches, [args.context], f"decode_{attribute}={value}_round{round_}")


if __name__ == "__main__":
    main()
