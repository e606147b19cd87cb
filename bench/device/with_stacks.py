"""Run a bench script (argv[2:]) with every thread's Python stack dumped to stderr each
argv[1] seconds: where a device call's step spends its time when it outlives its limit."""

import faulthandler
import runpy
import sys

faulthandler.dump_traceback_later(float(sys.argv[1]), repeat=True)
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
