"""kvstore's lmcache integration (see lmcache_adapter/README.md)."""
