package store

import "time"

// RecordBytes is what an execution's record is counted at against its
// tenant's history size: the bytes of its request and result as written.
func RecordBytes(x *Execution) int64 { return int64(len(x.Request) + len(x.Result)) }

// TrimWalk is TrimTenantExecutions's decision, the same for every
// backend: fed a tenant's records newest first, it finds the newest
// finished record at which their sizes pass keepBytes; that one and every
// older finished one go.
type TrimWalk struct {
	// Total is the size of every record fed.
	Total int64
	// removed is the size of the records that go.
	removed int64
	cut     bool
	cutAt   time.Time
	cutID   string
}

// Add feeds the next record (older than the last).
func (w *TrimWalk) Add(keepBytes int64, createdAt time.Time, id, status string, bytes int64) {
	w.Total += bytes
	finished := status != "pending" && status != "running"
	if !w.cut && finished && w.Total > keepBytes {
		w.cut, w.cutAt, w.cutID = true, createdAt, id
	}
	if w.cut && finished {
		w.removed += bytes
	}
}

// Cut reports whether any record goes.
func (w *TrimWalk) Cut() bool { return w.cut }

// CutAt is the newest record that goes: every finished one at it or
// older (by CreatedAt, then ID) goes.
func (w *TrimWalk) CutAt() (time.Time, string) { return w.cutAt, w.cutID }

// Kept is the size of the records that stay.
func (w *TrimWalk) Kept() int64 { return w.Total - w.removed }
