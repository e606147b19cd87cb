"""bench/serving_compiles.py, run on the CPU (nothing compiles there): the device call that runs
it on the bench preset (bench/device/call_bi.sh) must not find a broken script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_script_serves_its_requests_on_a_checkpoint_it_makes(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "bench" / "serving_compiles.py"), "--make", "tiny",
                           str(tmp_path / "ckpt"), "--shallow", "--device", "cpu", "--lengths", "37,70",
                           "--log", str(tmp_path / "serve.log"), "--ready-timeout-s", "120"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "request c0: prompt 37 tokens" in done.stdout, done.stdout
    assert "cached 40" in done.stdout, done.stdout  # the next turn found 37 + 4 - 1 tokens held
    assert done.stdout.count("completion 24") == 3, done.stdout  # the batch of three
    assert "0 kernel compiles while serving" in done.stdout, done.stdout
