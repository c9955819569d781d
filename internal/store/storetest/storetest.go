// Package storetest is the conformance suite every store.Store passes:
// CRUD of each record, the errdefs categories, tenant isolation, keyset
// pagination, filters, concurrent writers, session revisions
// (compare-and-swap), cascades, upload directory deletes, time round trips
// and leases (one holder at a time, renewal, expiry, release, fencing
// tokens). It checks behaviour, never timing; the backends' benchmarks
// measure that.
package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/internal/store"
)

// Run runs the suite against stores made by open: a fresh, empty store per
// call, closed by open's own t.Cleanup.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, open func(t *testing.T) store.Store)
	}{
		{"SessionCRUD", testSessionCRUD},
		{"SessionErrors", testSessionErrors},
		{"SessionRevisions", testSessionRevisions},
		{"ConcurrentUpdate", testConcurrentUpdate},
		{"SessionPagination", testSessionPagination},
		{"SessionFilters", testSessionFilters},
		{"PageLimits", testPageLimits},
		{"BadPageToken", testBadPageToken},
		{"ConcurrentCreate", testConcurrentCreate},
		{"ConcurrentMixed", testConcurrentMixed},
		{"DeleteSessionCascades", testDeleteSessionCascades},
		{"TenantIsolation", testTenantIsolation},
		{"TimeRoundTrip", testTimeRoundTrip},
		{"CountSessions", testCountSessions},
		{"TenantUsage", testTenantUsage},
		{"TrimExecutions", testTrimExecutions},
		{"TrimTenantExecutions", testTrimTenantExecutions},
		{"DueSessions", testDueSessions},
		{"SandboxSessions", testSandboxSessions},
		{"ExecutionCRUD", testExecutionCRUD},
		{"ExecutionErrors", testExecutionErrors},
		{"ExecutionPagination", testExecutionPagination},
		{"ExecutionSummaries", testExecutionSummaries},
		{"UnfinishedAndCounts", testUnfinishedAndCounts},
		{"DeleteExecutions", testDeleteExecutions},
		{"Uploads", testUploads},
		{"DeleteUploads", testDeleteUploads},
		{"LeaseOneHolder", testLeaseOneHolder},
		{"LeaseRenewal", testLeaseRenewal},
		{"LeaseExpiry", testLeaseExpiry},
		{"LeaseRelease", testLeaseRelease},
		{"LeaseErrors", testLeaseErrors},
		{"LeaseHolder", testLeaseHolder},
		{"LiveLeases", testLiveLeases},
		{"RWLock", testRWLock},
		{"Documents", testDocuments},
		{"ListDocuments", testListDocuments},
		{"DocumentErrors", testDocumentErrors},
		{"ConcurrentDocumentUpdates", testConcurrentDocumentUpdates},
		{"Events", testEvents},
		{"ConcurrentEvents", testConcurrentEvents},
		{"AppendEvents", testAppendEvents},
		{"Ping", testPing},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, open) })
	}
}

var ctx = context.Background()

// t0 has nanoseconds, which a store drops: sameTime allows for that.
var t0 = time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)

// sameTime reports whether got is want as a store keeps it.
func sameTime(got, want time.Time) bool {
	if want.IsZero() || got.IsZero() {
		return want.IsZero() && got.IsZero()
	}
	d := got.Sub(want)
	return got.Location() == time.UTC && got.Nanosecond()%1000 == 0 && d > -time.Microsecond && d < time.Microsecond
}

// sameJSON compares JSON documents as values: a backend may reformat them.
func sameJSON(a, b json.RawMessage) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == 0 && len(b) == 0
	}
	if bytes.Equal(a, b) {
		return true
	}
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

func newSession(tenant, id string, created time.Time) *store.Session {
	return &store.Session{
		Tenant: tenant, ID: id, Status: "pending", TemplateID: "python",
		Metadata:  map[string]string{"user_id": "u1"},
		Config:    json.RawMessage(`{"ttl":3600,"env":["A","B"]}`),
		CreatedAt: created, UpdatedAt: created, LastActivityAt: created, ExpiresAt: created.Add(time.Hour),
	}
}

// diffSession describes how got differs from want, "" if it does not.
func diffSession(got, want *store.Session) string {
	var d []string
	add := func(field string, g, w any) { d = append(d, fmt.Sprintf("%s = %v, want %v", field, g, w)) }
	if got.Tenant != want.Tenant || got.ID != want.ID {
		add("key", got.Tenant+"/"+got.ID, want.Tenant+"/"+want.ID)
	}
	if got.Status != want.Status {
		add("Status", got.Status, want.Status)
	}
	if got.TemplateID != want.TemplateID {
		add("TemplateID", got.TemplateID, want.TemplateID)
	}
	if got.SandboxID != want.SandboxID {
		add("SandboxID", got.SandboxID, want.SandboxID)
	}
	if got.Error != want.Error {
		add("Error", got.Error, want.Error)
	}
	if got.DiskMB != want.DiskMB {
		add("DiskMB", got.DiskMB, want.DiskMB)
	}
	if got.Revision != want.Revision {
		add("Revision", got.Revision, want.Revision)
	}
	wantMeta := want.Metadata
	if wantMeta == nil {
		wantMeta = map[string]string{}
	}
	if got.Metadata == nil || !reflect.DeepEqual(got.Metadata, wantMeta) {
		add("Metadata", got.Metadata, wantMeta)
	}
	if !sameJSON(got.Config, want.Config) {
		add("Config", string(got.Config), string(want.Config))
	}
	for _, tt := range []struct {
		name      string
		got, want time.Time
	}{
		{"CreatedAt", got.CreatedAt, want.CreatedAt},
		{"UpdatedAt", got.UpdatedAt, want.UpdatedAt},
		{"LastActivityAt", got.LastActivityAt, want.LastActivityAt},
		{"ExpiresAt", got.ExpiresAt, want.ExpiresAt},
		{"DueAt", got.DueAt, want.DueAt},
	} {
		if !sameTime(tt.got, tt.want) {
			add(tt.name, tt.got, tt.want)
		}
	}
	return strings.Join(d, "; ")
}

func diffExecution(got, want *store.Execution) string {
	var d []string
	add := func(field string, g, w any) { d = append(d, fmt.Sprintf("%s = %v, want %v", field, g, w)) }
	if got.Tenant != want.Tenant || got.ID != want.ID || got.SessionID != want.SessionID {
		add("key", got.Tenant+"/"+got.SessionID+"/"+got.ID, want.Tenant+"/"+want.SessionID+"/"+want.ID)
	}
	if got.Status != want.Status {
		add("Status", got.Status, want.Status)
	}
	if got.Language != want.Language || got.ConversationID != want.ConversationID || got.ContextID != want.ContextID {
		add("Language/ConversationID/ContextID", []string{got.Language, got.ConversationID, got.ContextID},
			[]string{want.Language, want.ConversationID, want.ContextID})
	}
	if got.Owner != want.Owner {
		add("Owner", got.Owner, want.Owner)
	}
	if !sameJSON(got.Request, want.Request) {
		add("Request", string(got.Request), string(want.Request))
	}
	if !sameJSON(got.Result, want.Result) {
		add("Result", string(got.Result), string(want.Result))
	}
	for _, tt := range []struct {
		name      string
		got, want time.Time
	}{
		{"CreatedAt", got.CreatedAt, want.CreatedAt},
		{"StartedAt", got.StartedAt, want.StartedAt},
		{"FinishedAt", got.FinishedAt, want.FinishedAt},
	} {
		if !sameTime(tt.got, tt.want) {
			add(tt.name, tt.got, tt.want)
		}
	}
	return strings.Join(d, "; ")
}

func testPing(t *testing.T, open func(t *testing.T) store.Store) {
	if err := open(t).Ping(ctx); err != nil {
		t.Fatalf("Ping = %v", err)
	}
}
