"""vLLM connector for kvstore (`KVStoreConnector`); see issue "vLLM connector".

Loaded by vLLM through `kv_connector_module_path: "kvstore_vllm"`. Not implemented yet:
importing this package only reserves the name.
"""
