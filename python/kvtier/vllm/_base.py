"""vLLM's KV connector interface, or a stand-in with the same names where vLLM is not
installed (Debian's Python in `make test` has no vLLM; the unit tests drive the connector
through kvtier_testing.vllm_harness)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

try:  # vLLM present: subclass the real interface.
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

    HAVE_VLLM = True
except Exception:  # noqa: BLE001 - any import failure means "no vLLM here"
    HAVE_VLLM = False

    class KVConnectorRole(enum.Enum):  # type: ignore[no-redef]
        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata:  # type: ignore[no-redef]
        pass

    class KVConnectorHandshakeMetadata:  # type: ignore[no-redef]
        pass

    class SupportsHMA:  # type: ignore[no-redef]
        pass

    class KVConnectorWorkerMetadata:  # type: ignore[no-redef]
        def aggregate(self, other):
            raise NotImplementedError

    @dataclass
    class KVConnectorTransferResults:  # type: ignore[no-redef]
        finished_sending: set = field(default_factory=set)
        finished_recving: set = field(default_factory=set)
        failed_recving: set = field(default_factory=set)

    @dataclass
    class KVConnectorStats:  # type: ignore[no-redef]
        data: dict = field(default_factory=dict)

    class KVConnectorBase_V1:  # type: ignore[no-redef]
        """Stand-in with vLLM's constructor and metadata plumbing (import without vLLM)."""

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
