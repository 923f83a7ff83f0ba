"""A kvtierd of one's own, for examples, benchmarks and tests: started on a temporary
socket with a config sized for the job, stopped (and its files removed) at the end."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time

import kvtier


def wait_until(predicate, what: str, timeout_s: float = 10.0, every_s: float = 0.02):
    """Polls `predicate` until it returns a true value (returned), or raises AssertionError
    naming `what` after `timeout_s`: a bounded wait on state, instead of a sleep that a
    busy machine outlasts."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(every_s)


def find_kvtierd() -> str:
    """$KVTIER_KVTIERD, else the build tree's (build/python/kvtier_testing or
    tests/python/kvtier_testing -> build/bin/kvtierd), else kvtierd on PATH."""
    env = os.environ.get("KVTIER_KVTIERD")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for built in (os.path.join(here, "..", "..", "bin", "kvtierd"),
                  os.path.join(here, "..", "..", "..", "build", "bin", "kvtierd")):
        if os.access(built, os.X_OK):
            return os.path.normpath(built)
    found = shutil.which("kvtierd")
    if found:
        return found
    raise kvtier.NotFoundError("no kvtierd binary: set KVTIER_KVTIERD, or put kvtierd on PATH")


class Daemon:
    """kvtierd on a temporary socket. ``pages`` of ``page_bytes`` in the host tier (in
    segments of 16 pages); ``nvme_bytes`` > 0 adds an NVMe tier with write-through, so a
    restart keeps every committed block. ``extra_yaml`` is appended to the config."""

    def __init__(self, *, page_bytes: int = 2 << 20, pages: int = 64, nvme_bytes: int = 0, extra_yaml: str = "",
                 log_level: str = "warning"):
        self.dir = tempfile.mkdtemp(prefix="kvt-py-")
        self.socket = os.path.join(self.dir, "kvtierd.sock")
        self.config = os.path.join(self.dir, "kvtierd.yaml")
        seg = page_bytes * 16
        capacity = -(-pages // 16) * seg
        cfg = (f"socket: {{path: {self.socket}}}\ndata_dir: {self.dir}/data\nmetrics: {{port: -1}}\n"
               f"log_level: {log_level}\n"
               f"tiers:\n  host: {{capacity: {capacity}, page_bytes: {page_bytes}, segment_bytes: {seg}}}\n")
        if nvme_bytes:
            cfg += (f"  nvme: {{files: [{{path: {self.dir}/slots0, capacity: {nvme_bytes}}}], durability: relaxed, "
                    f"write_policy: write_through}}\n")
        with open(self.config, "w") as f:
            f.write(cfg + extra_yaml)
        self.proc = None
        self.start()

    def start(self, timeout_s: float = 10.0) -> None:
        self._log = open(os.path.join(self.dir, "kvtierd.log"), "a")
        self.proc = subprocess.Popen([find_kvtierd(), "--config", self.config], stdout=self._log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise kvtier.InternalError(f"kvtierd exited at start: {self.log_tail()}")
            try:
                kvtier.ControlClient(self.socket, timeout_ms=1000).ping()
                return
            except kvtier.Error:
                time.sleep(0.05)
        raise kvtier.UnavailableError(f"kvtierd did not answer within {timeout_s} s: {self.log_tail()}")

    def log_tail(self, n: int = 2000) -> str:
        try:
            with open(os.path.join(self.dir, "kvtierd.log")) as f:
                return f.read()[-n:]
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> int:
        """SIGTERM and wait; the exit status (0: a clean shutdown)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.terminate()
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "Daemon":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
