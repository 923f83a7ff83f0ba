"""The connector's counters as Prometheus counters of vLLM's own /metrics (vLLM's
KVConnectorPromMetrics): ``vllm:kvtier_<counter>_total``, one series per engine, from the
stats the workers send each step (kvtier.vllm.metadata.COUNTERS)."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics
from vllm.v1.metrics.utils import create_metric_per_engine

from kvtier.vllm.metadata import COUNTERS, PROM_HELP


class KvtierPromMetrics(KVConnectorPromMetrics):
    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        counter_cls = metric_types[Counter]
        self._counters = {}
        for name in COUNTERS:
            unit = "seconds_" if name.endswith("_s") else ""
            metric = counter_cls(name=f"vllm:kvtier_{name.removesuffix('_s')}_{unit}total",
                                 documentation=PROM_HELP[name], labelnames=labelnames)
            self._counters[name] = create_metric_per_engine(metric, self.per_engine_labelvalues)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for name, per_engine in self._counters.items():
            value = transfer_stats_data.get(name, 0)
            if isinstance(value, (int, float)) and value > 0:
                per_engine[engine_idx].inc(value)
