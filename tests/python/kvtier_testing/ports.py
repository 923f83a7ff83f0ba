"""TCP ports for the servers tests start (vLLM, LMCache, Dynamo's indexer): below the
kernel's ephemeral range, free when picked, and held by a lock file so two kvtier test runs
never pick the same one."""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile

_PORT_LOCK_DIR = os.path.join(tempfile.gettempdir(), "kvtier-ports")


class PortLease:
    """A TCP port on 127.0.0.1 below the kernel's ephemeral range, free when picked and
    held by an flock on $TMPDIR/kvtier-ports/PORT until close(), so two kvtier test runs
    never pick the same one. A process that takes it outside that protocol is seen when
    the server fails to bind; the caller then takes another lease."""

    def __init__(self, rng: random.Random, low: int = 10000):
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
        os.makedirs(_PORT_LOCK_DIR, exist_ok=True)
        for _ in range(200):
            port = rng.randrange(low, ephemeral_low)
            fd = os.open(os.path.join(_PORT_LOCK_DIR, str(port)), os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            if _bindable(port):
                self.port, self._fd = port, fd
                return
            os.close(fd)
        raise RuntimeError(f"no free port in [{low}, {ephemeral_low}) after 200 tries")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False
