"""vLLM connector for kvstore: `KVStoreConnector`.

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KVStoreConnector",
        "kv_connector_module_path": "kvstore_vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"etcd": "127.0.0.1:2379"}}'

See vllm_adapter/README.md. Importing this package registers the connector's name with
vLLM's connector factory as well, so a MultiConnector can rebuild its stats by name.
"""

from kvstore_vllm.connector import (
    KVStoreConnector,
    KVStoreConnectorMetadata,
    KVStoreConnectorStats,
    KVStoreWorkerMetadata,
)
from kvstore_vllm.keys import FORMAT_VERSION, KeyPlan, Namespace, RankLayers
from kvstore_vllm.settings import Settings


def _register_with_vllm() -> None:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    if "KVStoreConnector" not in KVConnectorFactory._registry:
        KVConnectorFactory.register_connector("KVStoreConnector", "kvstore_vllm",
                                              "KVStoreConnector")


_register_with_vllm()

__all__ = [
    "FORMAT_VERSION",
    "KVStoreConnector",
    "KVStoreConnectorMetadata",
    "KVStoreConnectorStats",
    "KVStoreWorkerMetadata",
    "KeyPlan",
    "Namespace",
    "RankLayers",
    "Settings",
]
