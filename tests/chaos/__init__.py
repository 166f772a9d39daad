"""Chaos suite: seeded random operator events under checked traffic (issue 19, item 5).

`supervisor.py` restarts daemons as systemd's Restart=always would; `cluster.py` builds
etcd, two masters and three store nodes in the caller's private network namespace;
`traffic.py` runs checked client traffic that holds leases across events; `ledger.py`
accounts for every acknowledged object (pure logic, no I/O); `events.py` applies the
operator events; `driver.py` ties them together and prints the report table
(`python -m tests.chaos.driver --seed S --rounds R`, `make chaos`).
"""
