package session

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime/runtimetest"
	"github.com/sbx-sandbox/sbx/internal/store"
)

// oldConfig is a session's configuration as the store kept it when the
// session took the REST API's types (api.Resources, api.FileUploadConfig).
const oldConfig = `{"ttl":3600,"idle_timeout":60,"hibernate_timeout":600,"warm_up":true,` +
	`"resources":{"cpu":0.5,"memory":256,"disk":128},"env":{"A":"1"},"network":"none",` +
	`"upload":{"max_file_size":2,"max_file_size_unit":"GB","max_file_count":7,"allowed_file_types":["csv","image/*"]},` +
	`"template_hash":"abc"}`

// TestConfigReadsOldRecords: the JSON of Config is a storage format. A
// record written before the session had its own types reads back whole,
// and what is written now is what was written then.
func TestConfigReadsOldRecords(t *testing.T) {
	ctx := context.Background()
	m := newManager(t, runtimetest.NewFake())
	now := time.Now().UTC().Truncate(time.Microsecond)
	rec := &store.Session{
		Tenant: "t", ID: "old", Status: api.StatusHibernated, TemplateID: "python", Metadata: map[string]string{},
		Config: json.RawMessage(oldConfig), DiskMB: 128,
		CreatedAt: now, UpdatedAt: now, LastActivityAt: now, ExpiresAt: now.Add(time.Hour), DueAt: now.Add(time.Hour),
	}
	if err := m.opt.Store.CreateSession(ctx, rec); err != nil {
		t.Fatal(err)
	}
	s, err := m.Get(ctx, "t", "old")
	if err != nil {
		t.Fatal(err)
	}
	c := s.Config
	if c.TTL != 3600 || c.IdleTimeout != 60 || c.HibernateTimeout != 600 || !c.WarmUp || c.Network != "none" || c.TemplateHash != "abc" ||
		c.Resources != (Resources{CPU: 0.5, MemoryMB: 256, DiskMB: 128}) || c.Env["A"] != "1" ||
		c.Upload.MaxFileSize != 2 || c.Upload.MaxFileSizeUnit != "GB" || c.Upload.MaxFileCount != 7 || len(c.Upload.AllowedFileTypes) != 2 {
		t.Fatalf("an old record read back as %+v", c)
	}
	if c.MaxUploadBytes() != 2<<30 {
		t.Errorf("upload limit %d, want 2 GiB", c.MaxUploadBytes())
	}
	b, err := json.Marshal(c)
	if err != nil || string(b) != oldConfig {
		t.Errorf("written as\n%s\nwant\n%s", b, oldConfig)
	}
}

// TestCreateRequestInvariants: whichever edge a request comes through,
// the session holds it to its own bounds, and says which of its fields is
// wrong so that the edge can name it in its clients' words.
func TestCreateRequestInvariants(t *testing.T) {
	ctx := context.Background()
	m := newManager(t, runtimetest.NewFake(), func(o *Options) { o.MaxResources = Resources{CPU: 2, MemoryMB: 1024} })
	cases := []struct {
		field string
		req   CreateRequest
	}{
		{"ID", CreateRequest{ID: "../etc"}},
		{"Template", CreateRequest{Template: "../x"}},
		{"TTL", CreateRequest{TTL: -time.Nanosecond}},
		{"TTL", CreateRequest{TTL: MaxTTL + time.Nanosecond}},
		{"IdleTimeout", CreateRequest{IdleTimeout: math.MinInt64}},
		{"HibernateTimeout", CreateRequest{HibernateTimeout: math.MaxInt64}},
		{"Resources.CPU", CreateRequest{Resources: Resources{CPU: math.NaN()}}},
		{"Resources.CPU", CreateRequest{Resources: Resources{CPU: math.Inf(1)}}},
		{"Resources.CPU", CreateRequest{Resources: Resources{CPU: 3}}},
		{"Resources.MemoryMB", CreateRequest{Resources: Resources{MemoryMB: 2048}}},
		{"Resources.MemoryMB", CreateRequest{Resources: Resources{MemoryMB: -1}}},
		{"Resources.DiskMB", CreateRequest{Resources: Resources{DiskMB: math.MaxInt64}}},
		{"Env", CreateRequest{Env: map[string]string{"A=B": ""}}},
		{"Network", CreateRequest{Network: "host"}},
		{"Metadata", CreateRequest{Metadata: map[string]string{"k": "v\x00"}}},
		{"Upload.MaxFileSizeUnit", CreateRequest{Upload: UploadConfig{MaxFileSizeUnit: "TB"}}},
		{"Upload.MaxFileSize", CreateRequest{Upload: UploadConfig{MaxFileSize: 1 << 33, MaxFileSizeUnit: "GB"}}},
		{"Upload.MaxFileCount", CreateRequest{Upload: UploadConfig{MaxFileCount: -1}}},
		{"Upload.AllowedFileTypes", CreateRequest{Upload: UploadConfig{AllowedFileTypes: []string{"../x"}}}},
	}
	for _, c := range cases {
		if c.req.ID == "" {
			c.req.ID = "s"
		}
		_, _, err := m.Create(ctx, "t", c.req)
		var fe *FieldError
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%+v: %v, want an invalid %s", c.req, err, c.field)
		}
	}
	if _, err := m.Get(ctx, "t", "s"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a refused request left a session: %v", err)
	}
	// A part of a second is one more: a period is never cut to nothing.
	s, _, err := m.Create(ctx, "t", CreateRequest{ID: "ok", TTL: 1500 * time.Millisecond, IdleTimeout: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if s.Config.TTL != 2 || s.Config.IdleTimeout != 1 {
		t.Errorf("config %+v, want ttl 2 s and idle timeout 1 s", s.Config)
	}
}

func TestRenameField(t *testing.T) {
	names := map[string]string{"Env": "envVars"}
	err := fieldErr("Env", ": %q is not a variable name", "A=B")
	if got := RenameField(err, names).Error(); got != `envVars: "A=B" is not a variable name: invalid argument` {
		t.Errorf("renamed: %s", got)
	}
	if got := RenameField(err, nil); got != err {
		t.Errorf("a field without a name changed: %v", got)
	}
	other := errors.New("other")
	if got := RenameField(other, names); got != other {
		t.Errorf("an error that is no FieldError changed: %v", got)
	}
	if !errors.Is(RenameField(err, names), errdefs.ErrInvalidArgument) {
		t.Error("a renamed FieldError is no longer ErrInvalidArgument")
	}
}
