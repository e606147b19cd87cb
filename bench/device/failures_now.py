"""A pytest plugin for device calls (-p bench.device.failures_now): each failing test's report
is appended to $OUT/failures.txt as it arrives, so a run its step's limit stops still names
its failures and their tracebacks (-q prints them only at the end)."""

import os

_WRITES = True


def _path() -> str:
    return os.path.join(os.environ.get("OUT", "/tmp"), "failures.txt")


def pytest_configure(config):
    global _WRITES
    _WRITES = not hasattr(config, "workerinput")  # under xdist the controller writes, not its workers
    if _WRITES and os.path.exists(_path()):
        os.remove(_path())  # this run's failures only


def pytest_runtest_logreport(report):
    if report.failed and _WRITES:
        os.makedirs(os.path.dirname(_path()), exist_ok=True)
        with open(_path(), "a") as out:
            out.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")
