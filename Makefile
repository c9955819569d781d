# sbx: see README.md. Every target that runs sandboxes needs root.
export PATH := $(PATH):/usr/local/go/bin
GO      ?= go
STATICCHECK ?= $(shell $(GO) env GOPATH)/bin/staticcheck
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION) -X github.com/sbx-sandbox/sbx/internal/executor.Version=$(VERSION)

.PHONY: all setup build test test-integration bench lint run deb test-deb ci clean kube-up kube-down

all: build

# setup installs the Debian packages and Go modules sbx needs, then builds.
setup:
	@scripts/setup.sh

# Both binaries are static: the executor runs inside sandboxes whose rootfs
# has whatever libc the template has; sbx itself is one file to copy.
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/sbx ./cmd/sbx
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/sbx-executor ./cmd/sbx-executor

# Unit tests: no sandboxes, no root needed (tests that need root skip).
test:
	$(GO) test -count=1 ./...

# Integration tests: real runc sandboxes, real template builds (cached in
# /var/lib/sbx/templates). -p 1: the machine has two cores and sandboxes
# are the load.
test-integration: build
	$(GO) test -count=1 -p 1 -timeout 30m -tags integration ./...

bench: build
	$(GO) run ./bench

lint:
	@test -z "$$(gofmt -l . | tee /dev/stderr)" || (echo "gofmt: the files above need formatting" >&2; exit 1)
	$(GO) vet ./...
	$(GO) vet -tags integration ./...
	$(STATICCHECK) ./...
	$(STATICCHECK) -tags integration ./...

# run: serve the HTTP API on 127.0.0.1:7070 with the embedded defaults
# (SQLite, local files, runc). The python template is built in the
# background on first start (progress in the log).
run: build
	bin/sbx serve

# deb: bin/sbx_DEBVERSION_amd64.deb, the Debian package (packaging/deb:
# both binaries, the hardened systemd unit, /etc/default/sbx, the Grafana
# dashboard). build.sh says how VERSION becomes a Debian version. DEBDIR
# puts the package elsewhere.
DEBDIR ?= bin
deb: build
	@packaging/deb/build.sh '$(VERSION)' '$(DEBDIR)'

# test-deb installs the package, checks the unit with systemd-analyze,
# serves with the unit's command line and runs code through it, then
# purges the package (root; scripts/test-deb.sh).
test-deb:
	scripts/test-deb.sh

# ci is what .ci/run runs (after scripts/setup.sh): everything a change must
# pass. The integration run includes the unit tests, so they run once; the
# package's test runs after it, when the python template is built. The test
# cluster comes up first (minutes the first time, seconds once its binaries
# are cached): the kubernetes runtime's tests run against it, and a missing
# cluster fails them under CI. It stays up; `make kube-down` removes it.
ci: lint kube-up test-integration test-deb

# kube-up starts the one-node test cluster of the kubernetes runtime
# (scripts/kube.sh, docs/kubernetes.md; root); kube-down removes it and
# every trace but keeps the cached binaries.
kube-up:
	scripts/kube.sh up

kube-down:
	scripts/kube.sh down

clean:
	rm -rf bin
