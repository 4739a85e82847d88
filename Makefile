# The two commands people run: `make test` and `make train`. Everything else is CMake.
BUILD ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build test train bench parity clean

all: build

deps:
	@third_party/install-deps.sh

$(BUILD)/build.ninja: | deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS)

configure: deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS)

build: $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The main job. Until kiln-train lands it runs the demo.
train: build
	$(BUILD)/bin/kiln-demo

bench: build
	$(BUILD)/bin/kiln-bench ops

# ResNet-18 against torchvision (Debian's python3-torch); not part of `make test`, whose
# machines need not download PyTorch. Installs it when run as root.
parity: build
	@/usr/bin/python3 -c "import torch, torchvision" 2>/dev/null || \
	  { [ "$$(id -u)" -eq 0 ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-torch python3-torchvision; } || \
	  { echo "kiln: parity needs python3-torch and python3-torchvision (apt-get install them)"; exit 1; }
	cd $(BUILD) && ctest -R parity --output-on-failure

clean:
	rm -rf $(BUILD)
