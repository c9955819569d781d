package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime"
)

// This file is how the driver talks to the runtime binary and keeps its
// own small files in a bundle.

// ociState is the runtime's word for a container's state in ours.
func ociState(s string) runtime.State {
	switch s {
	case "running":
		return runtime.StateRunning
	case "paused", "pausing":
		return runtime.StatePaused
	case "created", "creating":
		return runtime.StateCreating
	default:
		return runtime.StateStopped
	}
}

type ociStateJSON struct {
	Status string `json:"status"`
	Pid    int    `json:"pid"`
}

func (r *Runtime) state(ctx context.Context, id string) (*ociStateJSON, error) {
	out, err := r.run(ctx, nil, "state", id)
	if err != nil {
		if notExist(out) {
			return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("sandbox %s: %s state: %v: %s", id, r.name, err, out)
	}
	var st ociStateJSON
	if err := json.Unmarshal(out, &st); err != nil {
		return nil, fmt.Errorf("sandbox %s: %s state: %w", id, r.name, err)
	}
	return &st, nil
}

// notExist recognises the runtime binaries' "no such container" answers;
// they exit 1 for that as for every other failure.
func notExist(out []byte) bool {
	s := string(out)
	return strings.Contains(s, "does not exist") || strings.Contains(s, "not found") || strings.Contains(s, "no such")
}

// run runs the runtime binary and returns its combined output (stdout only
// when stdio is given, which then receives the container's stdio).
func (r *Runtime) run(ctx context.Context, stdio *os.File, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, r.binary, append(append([]string(nil), r.global...), args...)...)
	var out bytes.Buffer
	if stdio != nil {
		// runc run --detach hands these to the container; a pipe here
		// would keep us waiting for the container to close it.
		cmd.Stdin = nil
		cmd.Stdout = stdio
		cmd.Stderr = stdio
	} else {
		cmd.Stdout = &out
		cmd.Stderr = &out
	}
	err := cmd.Run()
	if stdio != nil && err != nil {
		// The runtime's complaint went to the log file with the rest.
		return nil, err
	}
	return bytes.TrimSpace(out.Bytes()), err
}

func readPid(bundle string) int {
	b, err := os.ReadFile(filepath.Join(bundle, "pid"))
	if err != nil {
		return 0
	}
	var pid int
	fmt.Sscan(string(b), &pid)
	return pid
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}
