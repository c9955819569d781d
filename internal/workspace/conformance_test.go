package workspace_test

import (
	"testing"

	"github.com/sbx-sandbox/sbx/internal/workspace/workspacetest"
)

// TestLocalConformance runs the conformance suite on Local, with a shell
// as the sandbox user standing in for code in the sandbox.
func TestLocalConformance(t *testing.T) {
	workspacetest.Run(t, func(t *testing.T) workspacetest.Subject {
		dir, w := workspacetest.HostWorkspace(t)
		return workspacetest.Subject{W: w, Sandbox: workspacetest.HostShell(dir)}
	})
}
