package api

import "time"

// Template statuses: a template's, and its latest build's.
const (
	// TemplateReady: built, on this server; sessions start at once.
	TemplateReady = "ready"
	// TemplateNotBuilt: a built-in or operator template not built on this
	// server yet; the first session (or a POST of its name) builds it.
	TemplateNotBuilt = "not_built"
	// TemplateQueued and TemplateBuilding: its latest build waits for a
	// build slot, or runs.
	TemplateQueued   = "queued"
	TemplateBuilding = "building"
	// TemplateFailed and TemplateCancelled: its latest build ended
	// without a rootfs; nothing of it is left behind.
	TemplateFailed    = "failed"
	TemplateCancelled = "cancelled"
)

// Template is a template as GET /templates shows it.
type Template struct {
	Name string `json:"name"`
	// Source is builtin, operator (made with `sbx template build` on the
	// server) or tenant (made over the API; only its tenant sees it).
	Source string `json:"source"`
	// Status is ready, not_built, queued, building, failed or cancelled.
	Status string `json:"status"`
	// Hash is the version: the hash of what makes the rootfs. A session
	// keeps the version it started on.
	Hash    string `json:"hash"`
	Runtime string `json:"runtime"`
	Release string `json:"release"`
	// SizeBytes and BuiltAt are the current version's, once built.
	SizeBytes int64      `json:"size_bytes,omitempty"`
	BuiltAt   *time.Time `json:"built_at,omitempty"`
	// LastError says why the latest build failed.
	LastError string `json:"last_error,omitempty"`
	// Build is the latest build started over the API.
	Build *TemplateBuild `json:"build,omitempty"`
	// Versions are the tenant template's versions built, newest first.
	Versions []TemplateVersion `json:"versions,omitempty"`
}

// TemplateBuild is one build of a tenant's template.
type TemplateBuild struct {
	BuildID string `json:"build_id"`
	Hash    string `json:"hash"`
	// Status is queued, building, ready, failed or cancelled.
	Status     string     `json:"status"`
	Error      string     `json:"error,omitempty"`
	QueuedAt   time.Time  `json:"queued_at"`
	StartedAt  *time.Time `json:"started_at,omitempty"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

// TemplateVersion is a version of a tenant's template that was built.
type TemplateVersion struct {
	Hash      string    `json:"hash"`
	BuildID   string    `json:"build_id"`
	SizeBytes int64     `json:"size_bytes"`
	BuiltAt   time.Time `json:"built_at"`
}

// TemplateList is GET /templates: the built-ins, the operator's and the
// tenant's own, by name.
type TemplateList struct {
	Templates []Template `json:"templates"`
}
