"""Memory under holder churn (issue 33): the TUI, the guard daemon and ``serve`` side by side, each for the
same minutes, on the same GPUs whose holders keep being replaced by new processes.

    python -m benchmarks.churn                       # 10 minutes, 8 GPUs, 256 holders, 128 replaced every 2 s
    python -m benchmarks.churn --minutes 3 --label after --out /tmp/churn.md
    python -m benchmarks.churn --src /tmp/base       # the gputop source in /tmp/base (a before/after run)

Everything is real but the GPU library: the holders are real ``sleep`` processes (benchmarks/_churner.py
kills the oldest ``--replace`` of them every ``--every`` seconds and starts as many new ones), and the
fake NVML library (or, with ``--backend simulated`` or no C compiler, the simulated backend's scenario
file) is told the live ones after each change. The three run at once: the TUI in a tmux window
(``--size``, default 160x50), ``guard run --interval 1 --dry-run`` and ``serve --port 0 --interval 1``.
VmRSS of each is read every 5 s; the table gives it at 20%, 50% and 100% of the run (minutes 2, 5 and 10
of a 10-minute run) and the growth from the first to the last. Issue 33's goal: at most 2 MiB between
minute 2 and minute 10 for each.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import PY, ROOT, exit_cleanly_on_sigterm, gpu_specs, print_table, write_scenario
from benchmarks.fake_gpus import fake_nvml_dir
from benchmarks.tui import Tmux, wait_for

CHURNER = str(Path(__file__).with_name("_churner.py"))
GOAL_MIB = 2.0


def vm_rss_kb(pid: int) -> int | None:
    """Resident set (VmRSS) of a running process, in KiB; None when it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class Churn:
    """The churning holders and the GPU description that follows them (fake NVML config or scenario)."""

    def __init__(self, gpus: int, holders: int, replace: int, every: float, backend: str):
        self.gpus, self.n, self.replace, self.every, self.backend = gpus, holders, replace, every, backend
        self.dir = Path(tempfile.mkdtemp(prefix="gputop-bench-churn-"))
        self.pids_file = self.dir / "pids.json"
        self.generation = -1

    def env(self, src: Path) -> dict[str, str]:
        env = dict(os.environ)
        for var in ("GPUTOP_SCENARIO", "GPUTOP_BACKEND", "GPUTOP_CONFIG", "PYTHONDONTWRITEBYTECODE"):
            env.pop(var, None)
        env["XDG_CONFIG_HOME"] = str(self.dir / "config")
        env["XDG_STATE_HOME"] = env["GPUTOP_STATE_DIR"] = str(self.dir / "state")
        env["PYTHONPATH"] = str(src)
        env["GPUTOP_BACKEND"] = self.backend
        if self.backend == "simulated":
            env["GPUTOP_SCENARIO"] = str(self.dir / "scenario.yaml")
        else:
            lib = fake_nvml_dir()
            env["FAKE_NVML_CONFIG"] = str(self.dir / "fake_nvml.json")
            env["LD_LIBRARY_PATH"] = f"{lib}:{env['LD_LIBRARY_PATH']}" if env.get("LD_LIBRARY_PATH") else str(lib)
        return env

    def __enter__(self) -> "Churn":
        # Detached (sh exits at once): the holders hang off the churner, and it off init.
        args = [PY, CHURNER, str(self.pids_file), str(self.n), str(self.replace), str(self.every), str(os.getpid())]
        subprocess.run(["sh", "-c", "setsid " + " ".join(_q(a) for a in args) + " >/dev/null 2>&1 & exit 0"],
                       check=True, timeout=30)
        deadline = time.time() + 60
        while not self.pids_file.exists():
            if time.time() > deadline:
                raise RuntimeError("the churner did not start")
            time.sleep(0.05)
        self.follow()
        return self

    def follow(self) -> bool:
        """Describe the live holders to the GPU library if they changed; True if they did."""
        try:
            d = json.loads(self.pids_file.read_text())
        except (OSError, ValueError):
            return False
        if d["generation"] == self.generation:
            return False
        self.generation = d["generation"]
        holders = [(i % self.gpus, pid) for i, pid in enumerate(d["pids"])]
        if self.backend == "simulated":
            tmp = write_scenario(self.dir / "scenario.yaml.tmp", self.gpus, holders)
            os.replace(tmp, self.dir / "scenario.yaml")
        else:
            from tests.fakenvml.build import write_fake_nvml_config  # noqa: PLC0415

            write_fake_nvml_config(self.dir / "fake_nvml.json", gpu_specs(self.gpus),
                                   [{"pid": pid, "gpu": g, "memory": 1 << 30, "type": "C", "sm": 5}
                                    for g, pid in holders])
        return True

    def __exit__(self, *exc) -> None:
        # The churner watches our PID; stop it now (it kills and reaps every holder). Its PID is checked
        # to still be the churner (its command line) right before the signal.
        try:
            pid = json.loads(self.pids_file.read_text())["churner"]
            if CHURNER.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, 15)
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(1)
        shutil.rmtree(self.dir, ignore_errors=True)


def _q(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


def start_all(churn: Churn, src: Path, size: tuple[int, int], tmux: Tmux, pids: dict[str, int]) -> None:
    """The TUI in tmux, the guard daemon and serve, their PIDs put in ``pids`` as each starts (so that the
    caller stops those that did start, whatever happens next)."""
    env = churn.env(src)
    gputop = f"{PY} -m gputop"
    session = tmux.session(*size)
    # From ``src`` (python puts the working directory first on sys.path), so that --src is what runs.
    pids["tui"] = tmux.launch(session, "tui", f"env -C {_q(str(src))} {gputop} --interval 1")
    logs = churn.dir / "logs"
    logs.mkdir(exist_ok=True)
    for name, args in (("guard", ["guard", "run", "--interval", "1", "--dry-run", "--policy-file",
                                  str(ROOT / "examples" / "policy.yaml")]),
                       ("serve", ["serve", "--port", "0", "--no-socket", "--interval", "1"])):
        with open(logs / f"{name}.log", "wb") as log:
            p = subprocess.Popen([PY, "-m", "gputop", *args], env=env, stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True, cwd=src)
        pids[name] = p.pid
    check = subprocess.run([PY, "-c", "import gputop; print(gputop.__file__)"], env=env, cwd=src, text=True,
                           capture_output=True, timeout=60).stdout.strip()
    if not check.startswith(str(src.resolve())):
        raise RuntimeError(f"gputop is imported from {check}, not from {src}")
    wait_for(tmux, f"{session}:tui", [re.compile(r"H200"), re.compile(r"sleep")], time.perf_counter())
    time.sleep(3)
    for name in ("guard", "serve"):
        if vm_rss_kb(pids[name]) is None:
            raise RuntimeError(f"{name} exited: {(logs / f'{name}.log').read_text()[-600:]}")


def stop(pids: list[int], grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL for any still running after ``grace`` seconds (our own children: their PIDs
    cannot be reused before we reap them)."""
    for sig in (15, 9):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + grace
        while any(vm_rss_kb(p) is not None for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def run(minutes: float, src: Path, gpus: int, holders: int, replace: int, every: float, backend: str,
        size: tuple[int, int]) -> dict:
    """RSS (KiB) of each app every 5 s for ``minutes``: {"samples": {app: [(seconds, kb)]}, ...}."""
    churn = Churn(gpus, holders, replace, every, backend)
    with churn:
        with Tmux(churn.env(src)) as tmux:
            pids: dict[str, int] = {}
            try:
                start_all(churn, src, size, tmux, pids)
                samples: dict[str, list[tuple[float, int]]] = {name: [] for name in pids}
                t0 = time.monotonic()
                next_read = t0
                while (now := time.monotonic()) - t0 < minutes * 60:
                    churn.follow()
                    if now >= next_read:
                        for name, pid in pids.items():
                            kb = vm_rss_kb(pid)
                            if kb is None:
                                raise RuntimeError(f"{name} (pid {pid}) exited during the run")
                            samples[name].append((now - t0, kb))
                        next_read += 5
                    time.sleep(0.1)
            finally:
                stop([pids[name] for name in ("guard", "serve") if name in pids])  # (the TUI goes with tmux)
    return {"samples": samples, "replaced": churn.generation * replace, "backend": backend}


def at(samples: list[tuple[float, int]], t: float) -> int:
    """The sample nearest to ``t`` seconds."""
    return min(samples, key=lambda s: abs(s[0] - t))[1]


def report(result: dict, minutes: float, label: str, load: tuple) -> str:
    marks = (0.2, 0.5, 1.0)
    rows = []
    for name, samples in result["samples"].items():
        kb = [at(samples, minutes * 60 * m) for m in marks]
        growth = (kb[2] - kb[0]) / 1024
        rows.append([name, *(f"{k / 1024:.1f}" for k in kb), f"{growth:+.1f}",
                     "PASS" if growth <= GOAL_MIB else "MISS"])
    heads = ["app", *(f"RSS MiB @ {minutes * m:g} min" for m in marks), f"growth {minutes * 0.2:g}->{minutes:g} min",
             f"goal <= {GOAL_MIB:g} MiB"]
    notes = [f"{label}: {result['replaced']} holders replaced in {minutes:g} minutes ({result['backend']} backend); "
             f"load average at start {load[0]:.2f}, at end {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)"]
    return print_table(f"Memory under holder churn ({label})", heads, rows, notes)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.churn", description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--holders", type=int, default=256)
    ap.add_argument("--replace", type=int, default=128)
    ap.add_argument("--every", type=float, default=2.0)
    ap.add_argument("--size", default="160x50", help="the TUI's terminal, COLSxROWS")
    ap.add_argument("--backend", choices=("nvml", "simulated"), default=None,
                    help="default: the fake NVML library where it builds, else the simulated backend")
    ap.add_argument("--src", default=str(ROOT), help="the gputop source tree to run (default this one)")
    ap.add_argument("--label", default="this tree")
    ap.add_argument("--out", help="also append the table to this file")
    args = ap.parse_args(argv)
    if shutil.which("tmux") is None:
        print("churn: tmux is not installed (apt-get install tmux)", file=sys.stderr)
        return 2
    exit_cleanly_on_sigterm()
    backend = args.backend or ("nvml" if fake_nvml_dir() is not None else "simulated")
    cols, rows = (int(x) for x in args.size.lower().split("x"))
    load = os.getloadavg()
    result = run(args.minutes, Path(args.src), args.gpus, args.holders, args.replace, args.every, backend,
                 (cols, rows))
    text = report(result, args.minutes, args.label, load)  # (print_table prints it)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n")
        with open(args.out + ".json", "a") as f:
            f.write(json.dumps({"label": args.label, **result}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
