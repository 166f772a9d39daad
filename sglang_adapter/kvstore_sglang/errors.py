"""The backend's typed errors. SGLang catches exceptions around its storage calls and
logs them; these say what was wrong in one sentence."""

from __future__ import annotations


class KVStoreSGLangError(Exception):
    """Base of every error this package raises."""


class ConfigError(KVStoreSGLangError, ValueError):
    """A bad `--hicache-storage-backend-extra-config` (unknown key, bad value)."""


class UnsupportedLayout(ConfigError):
    """A host pool whose page layout this backend does not store."""


class NotRegistered(KVStoreSGLangError, RuntimeError):
    """A call that needs the host pool before `register_mem_pool_host`."""


class PageSizeMismatch(KVStoreSGLangError, ValueError):
    """A page (tensor or host indices) of another size than the registered pool's."""


class BadKey(KVStoreSGLangError, ValueError):
    """A page key that is not a non-empty string of SGLang's."""
