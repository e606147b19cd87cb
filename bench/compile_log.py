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
from dsflash.model.kernels.compile_watch import watch  # noqa: E402


def specialized(compile: dict) -> str:
    """The launch's specializations: arguments passed as constants (integers equal to 1 among
    them) and those known 16-byte aligned or divisible by 16."""
    names = list(compile["signature"])
    try:
        constants = {names[i[0]]: v for i, v in compile["constants"].items()}
        aligned = [names[i[0]] for i, attrs in compile["configs"][0].items()
                   if ["tt.divisibility", 16] in [list(a) for a in attrs]]
    except (KeyError, IndexError, TypeError):  # another triton's hook arguments
        return str(compile.get("configs"))[:600]
    ones = sorted(n for n, v in constants.items() if v == 1 and not isinstance(v, bool))
    # the constexprs (the shapes' MAX_CHUNKS, ROW_TILES, ..., the forms' switches): which of a
    # kernel's variants this is
    chosen = {n: v for n, v in constants.items() if isinstance(v, (bool, int)) and (v != 1 or isinstance(v, bool))}
    return f"ones={ones} aligned={aligned} constexprs={chosen}"


def main() -> None:
    start = time.monotonic()

    def log(took: float, repr: str, compile: dict) -> None:
        print(f"[compile] +{time.monotonic() - start:.2f} took {took:.2f} {repr.split('(')[0]} {specialized(compile)}",
              file=sys.stderr, flush=True)

    watch(log)
    script, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
