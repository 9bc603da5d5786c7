# kvstream: `make demo` runs the main job, `make test` runs the test suite.
# Both install missing Debian packages first (as root, or through sudo).

BUILD      ?= build
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

# What the build, the tests and the benchmarks need from Debian 12.
DEB_PACKAGES := cmake ninja-build g++ clang pkg-config \
  libfmt-dev libspdlog-dev libgtest-dev libzstd-dev libxxhash-dev libcli11-dev nlohmann-json3-dev \
  libucx-dev libfabric-dev liburing-dev libssl-dev

.PHONY: all deps configure build test demo clean

all: build

# Installs only what is missing; `apt-get update` first because a fresh machine's
# package lists are stale.
deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_ARGS)

configure: deps $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# Until the end-to-end demo exists: the tinyllama runtime, then the codec on a real
# story (the profile is built once, offline, from the first half of the eval text).
demo: build
	$(BUILD)/bin/kvstream-tinyllama generate --steps 60
	@test -f $(BUILD)/tinyllama.kvsprofile || $(BUILD)/bin/kvstream-profile --out $(BUILD)/tinyllama.kvsprofile
	$(BUILD)/bin/kvstream-codec-demo --profile $(BUILD)/tinyllama.kvsprofile

clean:
	rm -rf $(BUILD)
