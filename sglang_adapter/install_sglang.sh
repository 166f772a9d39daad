#!/bin/sh
# Install sglang for the integration's tests into an existing venv (filled in with the integration).
set -eu
PY="${1:?usage: install_sglang.sh PATH/TO/venv/bin/python}"
exit 0
