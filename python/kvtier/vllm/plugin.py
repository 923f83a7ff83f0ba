"""kvtier's vLLM general plugin (entry point ``vllm.general_plugins``), which vLLM runs in
each of its processes, the API server's included: registers ``KvtierConnector`` by name in
vLLM's connector registry. vLLM then loads it from ``"kv_connector": "KvtierConnector"``
alone, and code that looks connectors up by name finds it — ``MultiConnector``'s stats in the
API server do, and without the name a ``MultiConnector`` of NIXL and kvtier stopped the
server at its first stats record (vLLM 0.32: "Connector 'KvtierConnector' is not
registered")."""

from __future__ import annotations


def register() -> None:
    try:
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    except ImportError:  # a vLLM without a connector registry
        return
    try:
        KVConnectorFactory.register_connector("KvtierConnector", "kvtier.vllm.connector", "KvtierConnector")
    except ValueError:  # registered already (the plugin runs once per process, but be safe)
        pass
