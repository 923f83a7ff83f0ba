#!/usr/bin/env python3
"""Probe (hardening, fifth round): how long kvtierd is killable by a SIGHUP after its exec
(SIGHUP's default action ends a process), and how many starts one SIGHUP sent in that
time kills.

  python3 scripts/probe-early-sighup.py [--kvtierd build/bin/kvtierd] [--starts 30]

Per start: kvtierd on the embedded default in a fresh directory. The window: from the
moment /proc/PID/exe names kvtierd (exec done, the loader mapping its libraries) to the
moment /proc/PID/status shows SIGHUP caught (SigCgt), polled as fast as Python can. Then,
in as many more starts, one SIGHUP at a uniformly random time in [0, --spread ms) after the
exec, and whether kvtierd died of it. Run it against two builds with the same --spread."""

import argparse
import os
import random
import signal
import statistics
import subprocess
import tempfile
import time


def start(binary, d):
    real = os.path.realpath(binary)
    p = subprocess.Popen([real], cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if os.readlink(f"/proc/{p.pid}/exe") == real:
                return p, time.monotonic()
        except OSError:
            pass
    raise RuntimeError("kvtierd did not exec")


def stop(p):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def catches_sighup(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("SigCgt:"):
                return int(line.split()[1], 16) & 1
    return 0


def window_ms(binary):
    with tempfile.TemporaryDirectory() as d:
        p, t0 = start(binary, d)
        try:
            while time.monotonic() - t0 < 5:
                try:
                    if catches_sighup(p.pid):
                        return (time.monotonic() - t0) * 1000
                except OSError:
                    return float("nan")
            return float("nan")
        finally:
            stop(p)


def killed(binary, at_s):
    with tempfile.TemporaryDirectory() as d:
        p, t0 = start(binary, d)
        while time.monotonic() - t0 < at_s:
            pass
        os.kill(p.pid, signal.SIGHUP)
        time.sleep(0.3)
        died = p.poll() == -signal.SIGHUP
        stop(p)
        return died


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvtierd", default="build/bin/kvtierd")
    ap.add_argument("--starts", type=int, default=30)
    ap.add_argument("--spread", type=float, default=20.0, help="ms after the exec within which the SIGHUP lands")
    a = ap.parse_args()
    windows = [window_ms(a.kvtierd) for _ in range(a.starts)]
    rng = random.Random(1)
    deaths = sum(killed(a.kvtierd, rng.uniform(0, a.spread) / 1000) for _ in range(a.starts))
    print(f"{a.kvtierd}: killable for {statistics.median(windows):.1f} ms after its exec (median of {a.starts}; "
          f"max {max(windows):.1f}); one SIGHUP within {a.spread:g} ms of the exec killed {deaths} of {a.starts}")


if __name__ == "__main__":
    main()
