"""Run a bench script with every Triton compile logged: when it ended, how long it took, the
kernel and the integer specializations its launch asked for. Compiles inside a timed run are
what a warm-up missed (a 1M-token prefill spent ~3.6 s in its first 64K on an empty cache).

    python bench/compile_log.py bench/h200.py --sections prefill --prefill 1048576 ...

Writes one line per compile to stderr as `[compile] +SECONDS took SECONDS NAME ARGS`.
bench/h200.py counts the compiles inside each timed prefill itself (compile_watch.watch).
"""
import pathlib
import runpy
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from dsflash.model.kernels.compile_watch import variant, watch  # noqa: E402


def main() -> None:
    start = time.monotonic()

    def log(took: float, repr: str, compile: dict) -> None:
        print(f"[compile] +{time.monotonic() - start:.2f} took {took:.2f} {repr.split('(')[0]} {variant(compile)}",
              file=sys.stderr, flush=True)

    watch(log)
    script, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
