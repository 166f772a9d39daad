"""Generated gRPC modules for `proto/kvstore/v1/*.proto` (run `make proto`; do not edit)."""
