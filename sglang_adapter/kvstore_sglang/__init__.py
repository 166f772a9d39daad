"""kvstore's sglang integration (see sglang_adapter/README.md)."""
