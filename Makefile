# Thin wrapper: installs what is missing (Debian 12), configures into build/, builds, runs.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_ARGS ?=
DEB_PACKAGES := cmake g++ make libcaf-dev libtorch-dev doctest-dev nlohmann-json3-dev libcli11-dev

.PHONY: all deps configure build test bench demo format clean

all: build

deps:
	@./cmake/install-deps.sh $(DEB_PACKAGES)

configure: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

bench: build
	$(BUILD)/bench/ampactor-bench-kernels --json $(BUILD)/bench-kernels.json

demo: build
	@if [ -x $(BUILD)/demo/ampactor-demo ]; then $(BUILD)/demo/ampactor-demo; \
	else echo "make demo: the training demo is not built yet (it comes with its own issue)"; exit 2; fi

format:
	clang-format -i $$(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD)
