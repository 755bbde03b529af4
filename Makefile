# Thin wrapper over CMake. `make run` serves the bundled demo model on PORT (MODEL=DIR picks
# another); `make generate` prints a completion of PROMPT offline;
# `make test` sets up, builds and runs every test.
BUILD ?= build
JOBS ?= $(shell nproc)
MODEL ?= models/demo
PROMPT ?= ROMEO:
PORT ?= 8080

.PHONY: all setup build run generate test test-asan test-fuzz bench fmt clean

all: build

setup:
	scripts/setup

$(BUILD)/build.ninja $(BUILD)/Makefile:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release

build: $(BUILD)/Makefile
	cmake --build $(BUILD) -j $(JOBS)

# Builds only the server and the load client: the quickest way to a running server.
run: setup $(BUILD)/Makefile
	cmake --build $(BUILD) -j $(JOBS) --target pagoda pagoda-bench
	$(BUILD)/pagoda serve --model $(MODEL) --port $(PORT)

generate: setup build
	$(BUILD)/pagoda generate --model $(MODEL) --prompt "$(PROMPT)" -n 64

test: setup build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	$(MAKE) test-asan
	$(MAKE) test-fuzz

# Every libFuzzer target for a bounded time (clang, ASan + UBSan).
FUZZ_SECONDS ?= 15
test-fuzz:
	tests/fuzz/run.sh $(FUZZ_SECONDS)

# The unit tests and the engine test again under AddressSanitizer + UndefinedBehaviorSanitizer.
test-asan:
	cmake -S . -B $(BUILD)-asan -DCMAKE_BUILD_TYPE=Debug "-DPAGODA_SANITIZE=address;undefined" \
	  -DPAGODA_CUDA=OFF
	cmake --build $(BUILD)-asan -j $(JOBS)
	cd $(BUILD)-asan && ctest --output-on-failure -j $(JOBS) -L 'unit|engine'

bench: build
	$(BUILD)/pagoda bench decode --model $(MODEL) --prompt-len 128 --gen-len 32

fmt:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD) $(BUILD)-asan build-fuzz
