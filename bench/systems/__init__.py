"""The systems the benchmarks compare, one adapter each: `ours.Ours` (kvstore's client)
and `mooncake.Mooncake` (Mooncake Store's), both behind `base.System`. Each is imported
only in the client processes that use it (Mooncake's module is not needed for ours)."""
