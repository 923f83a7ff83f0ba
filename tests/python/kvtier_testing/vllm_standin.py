"""A stand-in for the part of vLLM's KV connector interface kvtier.vllm subclasses, for
the Python tests that run where vLLM is not installed (Debian's Python in `make test`):
`install()` registers it as the modules vLLM defines them in, unless vLLM itself imports.
The tests under tests/engines run the installed vLLM instead."""

from __future__ import annotations

import enum
import sys
import types
from dataclasses import dataclass, field

BASE = "vllm.distributed.kv_transfer.kv_connector.v1.base"
METRICS = "vllm.distributed.kv_transfer.kv_connector.v1.metrics"


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorMetadata:
    pass


class KVConnectorHandshakeMetadata:
    pass


class SupportsHMA:
    pass


class KVConnectorWorkerMetadata:
    def aggregate(self, other):
        raise NotImplementedError


@dataclass
class KVConnectorTransferResults:
    finished_sending: set = field(default_factory=set)
    finished_recving: set = field(default_factory=set)
    failed_recving: set = field(default_factory=set)


@dataclass
class KVConnectorStats:
    data: dict = field(default_factory=dict)


class KVConnectorBase_V1:
    """vLLM's constructor and metadata plumbing."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        self._connector_metadata = None
        self._vllm_config = vllm_config
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._kv_cache_config = kv_cache_config
        self._role = role

    @property
    def role(self):
        return self._role

    def bind_connector_metadata(self, connector_metadata):
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self):
        self._connector_metadata = None

    def _get_connector_metadata(self):
        assert self._connector_metadata is not None
        return self._connector_metadata

    def has_connector_metadata(self):
        return self._connector_metadata is not None


def install() -> bool:
    """Registers the stand-in as vLLM's modules unless vLLM imports; True when it did."""
    try:
        __import__(BASE)
        return False
    except ImportError:
        pass
    parts = BASE.split(".")
    for i in range(1, len(parts)):
        sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    base = types.ModuleType(BASE)
    for name in ("KVConnectorBase_V1", "KVConnectorHandshakeMetadata", "KVConnectorMetadata", "KVConnectorRole",
                 "KVConnectorTransferResults", "KVConnectorWorkerMetadata", "SupportsHMA"):
        setattr(base, name, globals()[name])
    metrics = types.ModuleType(METRICS)
    metrics.KVConnectorStats = KVConnectorStats
    sys.modules[BASE] = base
    sys.modules[METRICS] = metrics
    return True
