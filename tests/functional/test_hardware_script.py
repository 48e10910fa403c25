"""scripts/hardware-check.sh: syntax, and a dry run of its whole logic on the simulated backend.

The dry run fakes only what the machine lacks: nvidia-smi (lists nothing) and torch (its "allocation"
names the process as a holder in the simulated scenario). Every process, kill and reap is real.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "hardware-check.sh"

FAKE_TORCH = textwrap.dedent('''
    import fcntl, os, yaml
    uint8 = "uint8"
    class cuda:
        @staticmethod
        def is_available(): return True
        @staticmethod
        def synchronize(): pass
    class _T:
        def fill_(self, v): return self
    def empty(n, dtype=None, device=None):
        path = os.environ["FAKE_SCENARIO"]
        with open(path + ".lock", "w") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX)
            d = yaml.safe_load(open(path))
            d["holders"].append({"pid": os.getpid(), "gpu": 0, "memory": int(n * 1.1), "type": "C"})
            open(path + ".tmp", "w").write(yaml.safe_dump(d))
            os.replace(path + ".tmp", path)
        return _T()
''')


def test_syntax():
    r = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_without_a_gpu_it_says_why_and_exits_2(tmp_path):
    env = {**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin"}
    if shutil.which("nvidia-smi", path=env["PATH"]):
        return
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and r.stdout.startswith("SKIP hardware check: nvidia-smi not found")
    assert "FAIL" not in r.stdout


def test_dry_run_on_simulated_gpus_passes(tmp_path):
    (tmp_path / "bin").mkdir()
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.write_text("#!/bin/sh\nexit 0\n")
    smi.chmod(0o755)
    (tmp_path / "py" / "torch").mkdir(parents=True)
    (tmp_path / "py" / "torch" / "__init__.py").write_text(FAKE_TORCH)
    sc = tmp_path / "sc.yaml"
    sc.write_text("gpus: [{name: Fake H200, memory_total: 141GiB}]\nholders: []\n")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "PYTHONPATH": str(tmp_path / "py"),
           "FAKE_SCENARIO": str(sc), "PYTHON": sys.executable, "READY_TIMEOUT": "30", "STEP_TIMEOUT": "60",
           "GPUTOP": f"{sys.executable} -m gputop --scenario {sc}"}
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=240,
                       start_new_session=True)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert not [x for x in lines if x.startswith("FAIL")]
    assert sum(x.startswith("PASS") for x in lines) >= 15
    assert any("reap --apply" in x and "memory released" in x for x in lines)
    assert lines[-1] == "hardware check: all checks passed"
