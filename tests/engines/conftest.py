"""Fixtures of the real-engine tests: the tiny local model (config and tokenizer, made once
per session) and a kvtierd of each test's own."""

import os

import pytest

from kvtier_testing import tiny_model
from kvtier_testing.daemon import Daemon

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return tiny_model.make(str(tmp_path_factory.mktemp("tiny-llama")), layers=2, hidden=64, heads=4, kv_heads=2,
                           weights=False)


@pytest.fixture
def daemon():
    d = Daemon(page_bytes=64 << 10, pages=1024)
    yield d
    d.stop()
    d.close()
