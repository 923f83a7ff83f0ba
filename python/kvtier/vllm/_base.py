"""vLLM's KV connector interface, which kvtier.vllm's connector subclasses: imported from
the installed vLLM (the tests that run without one install a stand-in first:
tests/python/kvtier_testing/vllm_standin.py)."""

from __future__ import annotations

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore
        KVConnectorBase_V1,
        KVConnectorHandshakeMetadata,
        KVConnectorMetadata,
        KVConnectorRole,
        KVConnectorTransferResults,
        KVConnectorWorkerMetadata,
        SupportsHMA,
    )
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats  # type: ignore
except ImportError as e:
    raise ImportError(f"kvtier.vllm is vLLM's KV connector and needs vLLM installed ({e})") from e

__all__ = ["KVConnectorBase_V1", "KVConnectorHandshakeMetadata", "KVConnectorMetadata", "KVConnectorRole",
           "KVConnectorTransferResults", "KVConnectorWorkerMetadata", "SupportsHMA", "KVConnectorStats"]
