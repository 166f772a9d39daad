#!/bin/sh
# Install lmcache for the integration's tests into an existing venv (filled in with the integration).
set -eu
PY="${1:?usage: install_lmcache.sh PATH/TO/venv/bin/python}"
exit 0
