"""Fixtures of the Python tests: each test that needs a daemon gets a kvtierd of its own
(kvtier_testing.daemon.Daemon: a temporary socket and data dir, stopped at the end)."""

import os
import sys

import pytest

import kvtier
from kvtier_testing.daemon import Daemon


def peer_path() -> str:
    return os.path.join(os.environ.get("KVTIER_TESTS_DIR", ""), "kvtier-py-peer")


@pytest.fixture
def daemon():
    d = Daemon(page_bytes=64 << 10, pages=256)
    yield d
    rc = d.stop()
    d.close()
    assert rc == 0, f"kvtierd did not stop cleanly ({rc}): {d.log_tail()}"


@pytest.fixture
def nvme_daemon():
    d = Daemon(page_bytes=64 << 10, pages=128, nvme_bytes=64 << 20)
    yield d
    d.close()


LAYOUT = kvtier.Layout("py-test-model", layers=2, kv_heads=2, head_dim=64, dtype="bf16", tokens_per_block=16)
