"""Who may talk to the store: tokens and tenants (access), TLS material (tls), the
client-side credentials (credentials), and a development CA for `kvstore up` (devca).

The control plane (master and store-node gRPC, the master's fast channel) is what this
protects. The data plane, the Transfer Engine and the same-host memfd mapping, has no
authentication of its own; see the README's "Security" section.
"""
