module github.com/sbx-sandbox/sbx

go 1.26.0

require (
	github.com/opencontainers/runtime-spec v1.3.0
	go.uber.org/goleak v1.3.0
	golang.org/x/sys v0.49.0
)
