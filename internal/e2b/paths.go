package e2b

import (
	"fmt"
	"path"
	"strings"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// Paths. E2B's user works in /home/user; sbx's sandbox has its files at
// /workspace, the session's workspace, and nothing else of it survives or
// can be reached from the control plane. So the file calls take
// /workspace/... and, as an alias of it, /home/user/... and relative paths
// (E2B resolves those against the user's home). Any other absolute path is
// refused with a message saying so.

const (
	workspaceDir = "/workspace"
	homeDir      = "/home/user"
)

// sandboxPath is a path as a file call named it, resolved to the
// workspace.
type sandboxPath struct {
	// Rel is the workspace-relative path ("." for the workspace itself),
	// not yet cleaned by the workspace package (which checks it).
	Rel string
	// Base is the directory the caller's view is rooted at (/workspace or
	// /home/user), used to show paths back in the caller's terms.
	Base string
}

// resolve maps a path of a file call to the workspace.
func resolve(p string) (sandboxPath, error) {
	if p == "" {
		return sandboxPath{}, fmt.Errorf("path is empty: %w", errdefs.ErrInvalidArgument)
	}
	if strings.HasPrefix(p, "~/") || p == "~" {
		p = homeDir + strings.TrimPrefix(p, "~")
	}
	if !strings.HasPrefix(p, "/") {
		p = homeDir + "/" + p
	}
	clean := path.Clean(p)
	for _, base := range []string{workspaceDir, homeDir} {
		if clean == base {
			return sandboxPath{Rel: ".", Base: base}, nil
		}
		if rest, ok := strings.CutPrefix(clean, base+"/"); ok {
			if strings.Contains(p, "/../") || strings.HasSuffix(p, "/..") {
				// path.Clean resolved the ".."; refuse it instead, as the
				// workspace package does, so no name means two things.
				return sandboxPath{}, fmt.Errorf("path %q contains \"..\": %w", p, errdefs.ErrInvalidArgument)
			}
			return sandboxPath{Rel: rest, Base: base}, nil
		}
	}
	return sandboxPath{}, fmt.Errorf("path %q: sbx reaches only the sandbox's workspace, /workspace (also as /home/user and relative paths): %w", p, errdefs.ErrInvalidArgument)
}

// show is the path of a workspace-relative path in the caller's terms.
func (sp sandboxPath) show(rel string) string {
	if rel == "." || rel == "" {
		return sp.Base
	}
	return sp.Base + "/" + rel
}

// cwd is a command's or a context's working directory in the sandbox:
// "" is E2B's default, the home /home/user; ~ and relative directories
// are under it. Every sbx template has /home/user as a symlink to the
// workspace, so it needs no mapping here.
func cwd(dir string) (string, error) {
	if strings.IndexByte(dir, 0) >= 0 {
		return "", fmt.Errorf("cwd contains NUL: %w", errdefs.ErrInvalidArgument)
	}
	switch {
	case dir == "":
		dir = homeDir
	case dir == "~" || strings.HasPrefix(dir, "~/"):
		dir = homeDir + dir[1:]
	case !strings.HasPrefix(dir, "/"):
		dir = homeDir + "/" + dir
	}
	return path.Clean(dir), nil
}
