# kvstore: `make run` brings up a local dev cluster, `make test` runs the whole suite.
# Both work on a fresh Debian/Ubuntu machine as root: they install what is missing.

VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip
STAMP   := $(VENV)/.installed
BASE    := $(VENV)/.installed-base
TORCH   := $(VENV)/.installed-torch
# Tests run in a private network namespace holding only loopback: the Transfer Engine
# listens on every interface whatever address it is given.
NETNS   := unshare -n sh -c
PYTEST_ARGS ?=

.PHONY: setup system-deps run test test-unit test-vllm-next soak chaos lint proto clean

setup: system-deps $(STAMP)

system-deps:
	@missing=""; \
	command -v etcd >/dev/null 2>&1 || [ -x /usr/bin/etcd ] || missing="$$missing etcd-server"; \
	command -v etcdctl >/dev/null 2>&1 || missing="$$missing etcd-client"; \
	ldconfig -p | grep -q 'libibverbs.so.1 ' || missing="$$missing libibverbs1"; \
	ldconfig -p | grep -q 'libnuma.so.1 ' || missing="$$missing libnuma1"; \
	ldconfig -p | grep -q 'libcurl.so.4 ' || missing="$$missing libcurl4"; \
	command -v ip >/dev/null 2>&1 || missing="$$missing iproute2"; \
	command -v unshare >/dev/null 2>&1 || missing="$$missing util-linux"; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  if [ "$$(id -u)" != 0 ]; then echo "need root for apt-get (or install:$$missing)"; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

# The project and its dev tools, without torch or any engine: enough for the servers, the
# client, the unit tests and the linters (`make test-unit`, `make lint`).
$(BASE): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[te,dev]'
	touch $(BASE)

# torch is installed alone and pinned before any engine, so that nothing resolves a CUDA
# build (the unit tests of the GPU buffers and page checksums use its CPU tensors).
$(TORCH): $(BASE)
	$(PIP) install -q torch==2.13.0
	touch $(TORCH)

# vLLM (the CPU build) is installed for the connector's tests: see
# vllm_adapter/install_vllm.sh; SGLang and LMCache likewise.
$(STAMP): $(TORCH) vllm_adapter/install_vllm.sh sglang_adapter/install_sglang.sh lmcache_adapter/install_lmcache.sh
	sh vllm_adapter/install_vllm.sh $(PY)
	sh sglang_adapter/install_sglang.sh $(PY)
	sh lmcache_adapter/install_lmcache.sh $(PY)
	touch $(STAMP)

run: setup
	$(VENV)/bin/kvstore up

test: setup
	$(NETNS) 'ip link set lo up && exec $(PY) -m pytest -q $(PYTEST_ARGS)'

# The unit tests alone (no engine installed, torch's CPU build only; about a minute):
# `make test-unit PYTEST_ARGS='-k lease'` runs a subset.
test-unit: system-deps $(TORCH)
	$(NETNS) 'ip link set lo up && exec $(PY) -m pytest -q tests/unit $(PYTEST_ARGS)'

# The connector against the next vLLM's scheduler and connector API (vllm==0.33.0, a
# CUDA wheel: unpacked beside the venv, not installed, ~1 GB; its engine does not run here).
VLLM_NEXT := $(VENV)/vllm-0.33.0
test-vllm-next: setup
	test -d $(VLLM_NEXT)/vllm || { $(PIP) download -q --no-deps -d $(VLLM_NEXT).dl vllm==0.33.0 && \
	  $(PY) -m zipfile -e $(VLLM_NEXT).dl/vllm-0.33.0-*.whl $(VLLM_NEXT) && rm -rf $(VLLM_NEXT).dl; }
	$(NETNS) 'ip link set lo up && PYTHONPATH=$(VLLM_NEXT) exec $(PY) -m pytest -q -p no:cacheprovider \
	  tests/vllm/test_keys.py tests/vllm/test_scheduler.py tests/vllm/test_worker.py \
	  tests/vllm/test_multi.py tests/vllm/test_hybrid.py tests/vllm/test_tp.py \
	  tests/vllm/test_groups.py tests/vllm/test_promise.py'

# Ten minutes of mixed traffic; RSS slope per daemon and leftovers (a 60 s version runs
# in `make test`: tests/integration/test_soak.py).
soak: setup
	$(PY) -m bench.soak --seconds 600

# Seeded random operator events under checked traffic (tests/chaos/driver.py; a 3-event
# run is in `make test`). SEED replays a run; unset, one is drawn and printed first.
# SHARDS runs it against that many master shards (a leader and a standby each).
SEED   ?= -1
ROUNDS ?= 40
SHARDS ?= 1
chaos: setup
	$(NETNS) 'ip link set lo up && exec $(PY) -m tests.chaos.driver --seed $(SEED) --rounds $(ROUNDS) --shards $(SHARDS)'

lint: $(BASE)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy kvstore client/kvstore_client vllm_adapter/kvstore_vllm sglang_adapter/kvstore_sglang lmcache_adapter/kvstore_lmcache

# The generated modules are committed inside the package (kvstore/v1/) and must equal
# what this target produces; tests/unit/test_proto_generated.py checks it.
proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. --grpc_python_out=. proto/kvstore/v1/*.proto

clean:
	rm -rf $(VENV) .kvstore .pytest_cache .mypy_cache .ruff_cache
