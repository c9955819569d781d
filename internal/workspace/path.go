package workspace

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/sbx-sandbox/sbx/errdefs"
)

const (
	// MaxPathLen bounds a workspace path, in bytes (Linux's PATH_MAX).
	MaxPathLen = 4096
	// MaxNameLen bounds one path component, in bytes (Linux's NAME_MAX).
	MaxNameLen = 255
	// maxIDLen bounds an id that becomes a path component.
	maxIDLen = 128
	// uploadsDir holds the conversation temp areas. It belongs to the
	// sandbox's root so that user code can read it but not write into it.
	uploadsDir = "uploads"
)

// Managed says why rel (a CleanPath result) is not the caller's to write,
// move or remove through a file endpoint, or "" when it is: the workspace
// itself, and the parts sbx keeps on its own, the conversations' uploads
// (uploads/, changed by conversation uploads and deletes) and the
// session's resources (.resources/, changed by resource sync only).
//
// It judges the text only. The workspace's own writes, moves and removes
// use it for the names and check the real directories too (resolve.go);
// on its own it is no guard.
func Managed(rel string) string {
	switch {
	case rel == ".":
		return "the workspace itself"
	case rel == uploadsDir || strings.HasPrefix(rel, uploadsDir+"/"):
		return "uploads/ holds the conversations' uploads (upload there with a conversation id)"
	case rel == ResourcesDir || strings.HasPrefix(rel, ResourcesDir+"/"):
		return ResourcesDir + "/ holds the session's resources (change them with a resource sync)"
	}
	return ""
}

// InUploads reports whether rel (a CleanPath result) is below uploads/,
// where the conversations' uploads are: a path for SaveUpload's files and
// RemoveUpload, not for the user's calls.
func InUploads(rel string) bool {
	return strings.HasPrefix(rel, uploadsDir+"/")
}

// SandboxPath maps a path as code in the sandbox names it to a workspace
// path (a CleanPath result): /workspace, /home/user (a link to it in every
// template) and what is below them, or a path relative to the workspace.
// Any other absolute path is errdefs.ErrInvalidArgument, saying why.
func SandboxPath(p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return CleanPath(p)
	}
	for _, base := range []string{"/workspace", "/home/user"} {
		if rest, ok := strings.CutPrefix(p, base); ok && (rest == "" || rest[0] == '/') {
			return CleanPath(strings.TrimLeft(rest, "/"))
		}
	}
	return "", badPath(p, "is outside the workspace: name a file relative to it (data/x.csv) or by its path in the sandbox, under /workspace (or /home/user)")
}

// CleanPath validates a client-supplied workspace path and returns it in
// canonical form: relative, slash-separated, without "." or empty
// components or a trailing slash. "" and "." name the workspace root and
// give ".".
//
// It refuses (errdefs.ErrInvalidArgument) absolute paths, any ".."
// component (even one that would stay inside), NUL and other control
// characters, backslashes, invalid UTF-8, components over MaxNameLen bytes
// and paths over MaxPathLen bytes. Control characters are refused because
// names end up in logs and Content-Disposition headers; backslashes
// because a Windows client means a separator by them, and a name that one
// consumer reads as "a\b" and another as "a/b" (zip, presigned URLs) is a
// traversal waiting to happen. Files the sandbox names that way are still
// listed, just not addressable through the API.
func CleanPath(p string) (string, error) {
	if len(p) > MaxPathLen {
		return "", fmt.Errorf("path of %d bytes: longer than the limit of %d: %w", len(p), MaxPathLen, errdefs.ErrInvalidArgument)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", badPath(p, "contains NUL")
	}
	if !utf8.ValidString(p) {
		return "", badPath(p, "is not valid UTF-8")
	}
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c < 0x20 || c == 0x7f:
			return "", badPath(p, "contains a control character")
		case c == '\\':
			return "", badPath(p, `contains a backslash; separate directories with "/"`)
		}
	}
	if strings.HasPrefix(p, "/") {
		msg := "must be relative to the workspace"
		if rest, ok := strings.CutPrefix(p, "/workspace/"); ok {
			msg += fmt.Sprintf(" (%q, not the path inside the sandbox)", rest)
		}
		return "", badPath(p, msg)
	}
	var b strings.Builder
	b.Grow(len(p))
	for c := range strings.SplitSeq(p, "/") {
		switch {
		case c == "" || c == ".":
			continue
		case c == "..":
			return "", badPath(p, `contains ".."`)
		case len(c) > MaxNameLen:
			return "", badPath(p, fmt.Sprintf("has a component longer than %d bytes", MaxNameLen))
		}
		if b.Len() > 0 {
			b.WriteByte('/')
		}
		b.WriteString(c)
	}
	if b.Len() == 0 {
		return ".", nil
	}
	return b.String(), nil
}

func badPath(p, why string) error {
	return fmt.Errorf("path %s: %s: %w", quote(p), why, errdefs.ErrInvalidArgument)
}

// quote quotes a path for an error message, cut short so that a hostile
// 4 KiB name does not flood the log.
func quote(p string) string {
	const max = 200
	if len(p) > max {
		return fmt.Sprintf("%q...", p[:max])
	}
	return fmt.Sprintf("%q", p)
}

// ValidID reports whether s may be used as a conversation id, or any other
// id that becomes one path component: 1 to 128 of [A-Za-z0-9._-], starting
// with a letter or digit, without "..".
func ValidID(s string) bool {
	if len(s) == 0 || len(s) > maxIDLen || strings.Contains(s, "..") {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
		if !alnum && (i == 0 || c != '.' && c != '_' && c != '-') {
			return false
		}
	}
	return true
}

// ConversationDir is the workspace path of a conversation's temp area,
// where the files a user uploaded in that conversation are kept. cid must
// satisfy ValidID.
func ConversationDir(cid string) string {
	return uploadsDir + "/" + cid + "/temparea"
}
