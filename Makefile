# moxi: `make run` builds and starts moxi on its embedded default; `make demo` starts it in
# front of three local memcached (after `make deps`); `make test` runs every test.
export PATH := $(PATH):/usr/local/go/bin:/usr/sbin

.PHONY: build run demo test accept deps fuzz bench release

build:
	go build -o bin/moxi ./cmd/moxi

run: build
	./bin/moxi

# Three memcached on 127.0.0.1:11401-11403, moxi on 127.0.0.1:11400 (configs/demo.yaml);
# prints what to try; Ctrl-C stops them all.
demo: build
	./scripts/demo.sh

deps:
	./scripts/install-deps.sh

# Every package's tests, packages in parallel: no test asserts a wall-clock bound (speed
# lives in benchmarks), so they pass on a loaded machine. Then the allocation counts, which
# -race makes meaningless (sync.Pool drops what it is given): their files build without it.
# Tests that mostly wait (timers, polls, child tools) call t.Parallel; -parallel 6 lets that
# many wait together on 2 cores.
test: deps
	go vet ./...
	go test -race -count=1 -parallel 6 -timeout 16m ./...
	go test -count=1 -run 'Allocs' ./internal/...

# End-to-end checks that take over 30 s each (files tagged accept, tests named TestAccept*):
# 100 reloads and DNS changes, release builds, long sieges. CI runs it after `make test`.
# Those that mostly wait, or measure moxi's own memory, call t.Parallel and run together once
# the others (which time answers) are done.
accept: deps
	go test -race -count=1 -parallel 6 -tags accept -run '^TestAccept' -timeout 30m ./test/

# Each fuzz target for FUZZTIME (default 60s); not part of `make test`.
FUZZTIME ?= 60s
fuzz:
	go test -run='^$$' -fuzz='^FuzzTextRead$$' -fuzztime=$(FUZZTIME) ./internal/protocol/
	go test -run='^$$' -fuzz='^FuzzBinaryRead$$' -fuzztime=$(FUZZTIME) ./internal/protocol/
	go test -run='^$$' -fuzz='^FuzzBinaryResponse$$' -fuzztime=$(FUZZTIME) ./internal/protocol/
	go test -run='^$$' -fuzz='^FuzzMetaRead$$' -fuzztime=$(FUZZTIME) ./internal/protocol/
	go test -run='^$$' -fuzz='^FuzzReadMetaAnswer$$' -fuzztime=$(FUZZTIME) ./internal/protocol/
	go test -run='^$$' -fuzz='^FuzzParse$$' -fuzztime=$(FUZZTIME) ./internal/config/
	go test -run='^$$' -fuzz='^FuzzConvert$$' -fuzztime=$(FUZZTIME) ./internal/twemproxyconf/
	go test -run='^$$' -fuzz='^FuzzParseUsers$$' -fuzztime=$(FUZZTIME) ./internal/config/
	go test -run='^$$' -fuzz='^FuzzParsePlain$$' -fuzztime=$(FUZZTIME) ./internal/auth/
	go test -run='^$$' -fuzz='^FuzzParseText$$' -fuzztime=$(FUZZTIME) ./internal/auth/
	go test -run='^$$' -fuzz='^FuzzParseMetadumpLine$$' -fuzztime=$(FUZZTIME) ./internal/migrate/
	go test -run='^$$' -fuzz='^FuzzReadItem$$' -fuzztime=$(FUZZTIME) ./internal/migrate/
	go test -run='^$$' -fuzz='^FuzzParseClusterConfig$$' -fuzztime=$(FUZZTIME) ./internal/discover/

bench:
	go test -run='^$$' -bench=. -benchmem ./internal/...

# The release in VERSION for linux/amd64, linux/arm64 and darwin/arm64: static binaries named
# moxi-<release>-<os>-<arch>, stamped with the release, and their SHA256SUMS, in DIST.
RELEASE := $(shell cat VERSION)
DIST ?= dist
PLATFORMS := linux/amd64 linux/arm64 darwin/arm64
release:
	mkdir -p $(DIST)
	rm -f $(DIST)/moxi-* $(DIST)/SHA256SUMS
	for p in $(PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch go build -trimpath -ldflags "-s -w -X main.version=$(RELEASE)" \
			-o $(DIST)/moxi-$(RELEASE)-$$os-$$arch ./cmd/moxi || exit 1; \
	done
	cd $(DIST) && sha256sum moxi-$(RELEASE)-* > SHA256SUMS
