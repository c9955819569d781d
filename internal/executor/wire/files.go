package wire

import (
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// The file routes (PROTOCOL.md, "Files"): a workspace.Workspace served by
// the executor on the sandbox's own workspace. Entries, saved files and
// resources travel as workspace.Entry, workspace.SavedFile and
// workspace.Resource encode them; the envelopes below are the rest.
const (
	FilesStat        = "/files/stat"
	FilesList        = "/files/list"
	FilesContent     = "/files/content"
	FilesUpload      = "/files/upload"
	FilesMkdir       = "/files/mkdir"
	FilesRename      = "/files/rename"
	FilesConvo       = "/files/conversation"
	FilesResources   = "/files/resources"
	FilesUsage       = "/files/usage"
	FilesArchive     = "/files/archive"
	FilesEntryHeader = "X-Sbx-Entry"
	// ResourceManifestName is the first entry of a resource sync's tar
	// body; the entries after it are named by their content's SHA-256.
	ResourceManifestName = "manifest.json"
)

// Bounds of the file routes, which both sides apply: what an honest peer
// never goes past.
const (
	// MaxListEntries bounds max_entries of a listing (the bound of
	// workspace's own walks).
	MaxListEntries = workspace.MaxArchiveEntries
	// MaxEntryJSON bounds the JSON of one workspace.Entry: a path, a
	// name and a link target, each escaped at worst 6 bytes a byte, and
	// the fixed fields.
	MaxEntryJSON = 6*(2*workspace.MaxPathLen+workspace.MaxNameLen) + 1024
	// MaxManifestJSON bounds a resource manifest's JSON, and that of a
	// workspace.ResourceSync's answer (its four lists name at most twice
	// MaxResources names).
	MaxManifestJSON = 2*workspace.MaxResources*(6*workspace.MaxPathLen+256) + 1024
)

// ListLine is one line of a listing's stream (application/x-ndjson):
// every entry is a line of its own, and the last line has End set.
type ListLine struct {
	*workspace.Entry
	End       bool `json:"end,omitempty"`
	Truncated bool `json:"truncated,omitempty"`
}

// Usage is the answer to GET /files/usage.
type Usage struct {
	Bytes int64 `json:"bytes"`
	Files int   `json:"files"`
}

// Resources is the answer to GET /files/resources and the manifest of a
// resource sync.
type Resources struct {
	Resources []workspace.Resource `json:"resources"`
}

// ResourceSync is the answer to a resource sync: workspace.ResourceSync
// with names on the wire.
type ResourceSync struct {
	Needed    []workspace.Resource `json:"needed"`
	Added     []string             `json:"added"`
	Changed   []string             `json:"changed"`
	Removed   []string             `json:"removed"`
	Unchanged int                  `json:"unchanged"`
}
