# Thin wrapper: installs what is missing (Debian 12), configures into build/, builds, runs.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_ARGS ?=
# The metrics sinks: TensorBoard's event files (protobuf, Boost's CRC) and a Prometheus endpoint.
METRICS_PACKAGES := libprotobuf-dev protobuf-compiler libboost-dev prometheus-cpp-dev
DEB_PACKAGES := cmake g++ make libcaf-dev libtorch-dev doctest-dev nlohmann-json3-dev libcli11-dev \
	libgloo-dev iproute2 $(METRICS_PACKAGES)
# The demo's extras: a plot, and an optimised BLAS (Debian's LibTorch otherwise runs its matmuls on
# the reference BLAS, about 15x slower here).
DEMO_PACKAGES := gnuplot-nox libopenblas0-openmp
# test-slow's launchers: Open MPI's mpirun and a one-node Slurm (tests/hosts; make test's hosts,
# network namespaces, need iproute2's ip above); a Prometheus server and curl to scrape the
# metrics endpoint.
SLOW_PACKAGES := openmpi-bin slurmctld slurmd slurm-client munge prometheus curl
# The sanitizer gate's compiler: clang with its sanitizer and libFuzzer runtimes.
ASAN_PACKAGES := clang libclang-rt-14-dev

.PHONY: all deps configure build test test-slow tsan asan bench demo format clean

all: build

deps:
	@./scripts/install-deps.sh $(DEB_PACKAGES)

configure: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# Every test but those labelled slow (the examples rebuilt with ampactor as a subproject), which
# test-slow runs; CI runs both.
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE slow --output-junit ctest-junit.xml
	@sh scripts/ctest-summary.sh $(BUILD)/ctest-junit.xml

# The benchmarks build here too (they are not part of `all`), so CI still compiles them.
test-slow: build
	@./scripts/install-deps.sh $(SLOW_PACKAGES)
	cmake --build $(BUILD) -j $(JOBS) --target ampactor-benches
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L slow --output-junit ctest-slow-junit.xml
	@sh scripts/ctest-summary.sh $(BUILD)/ctest-slow-junit.xml

# The ThreadSanitizer gate (scripts/tsan-gate.sh): CAF and the actor suites built with TSan.
tsan: deps
	./scripts/tsan-gate.sh

# The AddressSanitizer+UBSan gate (scripts/asan-gate.sh): the whole suite built with clang and
# -fsanitize=address,undefined, then each libFuzzer target in fuzz/ for FUZZ_SECONDS (60).
asan: deps
	@./scripts/install-deps.sh $(ASAN_PACKAGES)
	./scripts/asan-gate.sh

# The benches run on the optimised BLAS, as the demo does (each bench's JSON records which BLAS
# and thread counts it ran with, under "setup").
bench: build
	@./scripts/install-deps.sh $(DEMO_PACKAGES)
	cmake --build $(BUILD) -j $(JOBS) --target ampactor-benches
	$(BUILD)/bench/ampactor-bench-kernels --json $(BUILD)/bench-kernels.json
	$(BUILD)/bench/ampactor-bench-actors --json $(BUILD)/bench-actors.json
	$(BUILD)/bench/ampactor-bench-overlap --json $(BUILD)/bench-overlap.json
	$(BUILD)/bench/ampactor-bench-metrics --json $(BUILD)/bench-metrics.json

demo: build
	@./scripts/install-deps.sh $(DEMO_PACKAGES)
	$(BUILD)/demo/ampactor-demo --out out/demo

format:
	clang-format -i $$(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD)
