package session

import (
	"errors"
	"fmt"
	"math"
	"path"
	"regexp"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// Limits and defaults of a session's configuration.
const (
	DefaultTTL              = 24 * time.Hour
	MaxTTL                  = 7 * 24 * time.Hour
	DefaultIdleTimeout      = 10 * time.Minute
	DefaultHibernateTimeout = 24 * time.Hour
	DefaultTemplate         = "python"

	defaultMaxFileSize  = 100 // MB
	defaultMaxFileCount = 1000
	maxFileSizeBytes    = 10 << 30
	maxFileCount        = 100_000
	maxFileTypes        = 100
	maxEnvVars          = 1000
	maxEnvBytes         = 1 << 20
	maxMetadata         = 64
	maxMetadataValue    = 1024
	maxCPU              = 16
	minMemoryMB         = 64
	maxMemoryMB         = 64 << 10
	minDiskMB           = 16
	maxDiskMB           = 1 << 20
)

// Defaults are the lifecycle periods of sessions created without their
// own, configurable per server.
type Defaults struct {
	// TTL is how long a session lives (at most MaxTTL).
	TTL time.Duration
	// IdleTimeout is how long without activity pauses a sandbox.
	IdleTimeout time.Duration
	// HibernateTimeout is how long without activity hibernates a session.
	HibernateTimeout time.Duration
}

// withDefaults fills the zero fields of d with the built-in defaults.
func (d Defaults) withDefaults() Defaults {
	if d.TTL <= 0 {
		d.TTL = DefaultTTL
	}
	if d.IdleTimeout <= 0 {
		d.IdleTimeout = DefaultIdleTimeout
	}
	if d.HibernateTimeout <= 0 {
		d.HibernateTimeout = DefaultHibernateTimeout
	}
	return d
}

// Check reports a default out of range.
func (d Defaults) Check() error {
	for _, p := range []struct {
		name string
		v    time.Duration
	}{{"ttl", d.TTL}, {"idle timeout", d.IdleTimeout}, {"hibernate timeout", d.HibernateTimeout}} {
		if p.v < 0 || p.v > MaxTTL {
			return fmt.Errorf("default %s %v: want 1s..%v", p.name, p.v, MaxTTL)
		}
	}
	return nil
}

// CreateRequest is what a session is created with, in the domain's
// terms. Each edge (REST, E2B, the agents) builds one from its own wire
// request; zero fields take the defaults.
type CreateRequest struct {
	// ID is the session's id, or empty for one the server chooses.
	ID string
	// Template names the template (DefaultTemplate when empty).
	Template string
	// TTL, IdleTimeout and HibernateTimeout are the lifecycle periods,
	// 0..MaxTTL; 0 is the server's default (Defaults).
	TTL, IdleTimeout, HibernateTimeout time.Duration
	// WarmUp asks for a sandbox at create rather than at the first
	// execution.
	WarmUp bool
	// Resources' zero fields are the template's defaults.
	Resources Resources
	Env       map[string]string
	// Network is "none" (or empty): sandboxes have loopback only.
	Network  string
	Metadata map[string]string
	// Upload's zero fields are the built-in defaults.
	Upload UploadConfig
}

// Resources are what one session's sandboxes may use. The JSON names are
// the store's format of Config (records written before this type was the
// session's own have them): keep them.
type Resources struct {
	// CPU is in cores (0.5 = half a core).
	CPU float64 `json:"cpu,omitempty"`
	// MemoryMB caps memory, in MiB.
	MemoryMB int64 `json:"memory,omitempty"`
	// DiskMB is the workspace's quota, in MiB.
	DiskMB int64 `json:"disk,omitempty"`
}

// UploadConfig limits what may be uploaded into a session. The
// size keeps the unit it was asked in, because that is what the session
// shows. The JSON names are the store's format of Config: keep them.
type UploadConfig struct {
	// MaxFileSize, in MaxFileSizeUnit, bounds one file.
	MaxFileSize int64 `json:"max_file_size,omitempty"`
	// MaxFileSizeUnit is KB, MB or GB (powers of 1024).
	MaxFileSizeUnit string `json:"max_file_size_unit,omitempty"`
	// MaxFileCount bounds the files uploaded and not deleted since.
	MaxFileCount int `json:"max_file_count,omitempty"`
	// AllowedFileTypes, if not empty, lists the file name extensions
	// (".csv", "pdf") or media types ("text/csv", "image/*") that may be
	// uploaded, lowercase.
	AllowedFileTypes []string `json:"allowed_file_types,omitempty"`
}

// Config is what a session was created with, after validation and
// defaults. It is kept in the store as JSON: the field names are a
// storage format, read back from records of every earlier version.
type Config struct {
	TTL         int64 `json:"ttl"`          // seconds
	IdleTimeout int64 `json:"idle_timeout"` // seconds
	// HibernateTimeout is the idle time, in seconds, after which the
	// session is hibernated; 0 in records older than the field means the
	// server's default.
	HibernateTimeout int64 `json:"hibernate_timeout,omitempty"`
	// WarmUp asks for a sandbox at create rather than at the first
	// execution.
	WarmUp    bool              `json:"warm_up,omitempty"`
	Resources Resources         `json:"resources"`
	Env       map[string]string `json:"env,omitempty"`
	Network   string            `json:"network"`
	Upload    UploadConfig      `json:"upload"`
	// TemplateHash pins the template build the session's sandboxes run
	// a session keeps the version it started with). Empty until
	// the first sandbox starts.
	TemplateHash string `json:"template_hash,omitempty"`
}

// MaxUploadBytes is the upload size limit in bytes.
func (c *Config) MaxUploadBytes() int64 {
	unit := int64(1 << 20)
	switch c.Upload.MaxFileSizeUnit {
	case "KB":
		unit = 1 << 10
	case "GB":
		unit = 1 << 30
	}
	return c.Upload.MaxFileSize * unit
}

var (
	// IDPattern is what session, conversation and context ids look like:
	// they become path components and sandbox labels.
	IDPattern       = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	envNamePattern  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,255}$`)
	metaKeyPattern  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	fileTypePattern = regexp.MustCompile(`^(\.?[A-Za-z0-9][A-Za-z0-9._+-]{0,31}|[a-z0-9][a-z0-9.+-]{0,63}/([a-z0-9][a-z0-9.+-]{0,63}|\*))$`)
)

// ValidID reports whether s is a valid session, conversation or context id.
func ValidID(s string) bool { return IDPattern.MatchString(s) && !strings.Contains(s, "..") }

func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

// FieldError is an invalid field of a CreateRequest (ErrInvalidArgument).
// Field is the path of its Go name in CreateRequest ("Resources.CPU");
// Detail is the rest of the message, starting with a space or a colon, in
// the units of the field, which are the wire's too. An edge names the
// field as its clients sent it (RenameField) where it translates their
// request, so that no edge's clients read another's names.
type FieldError struct {
	Field  string
	Detail string
}

func (e *FieldError) Error() string {
	return e.Field + e.Detail + ": " + errdefs.ErrInvalidArgument.Error()
}

// Unwrap makes a FieldError an ErrInvalidArgument.
func (e *FieldError) Unwrap() error { return errdefs.ErrInvalidArgument }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Detail: fmt.Sprintf(format, args...)}
}

// RenameField returns err with the field of its FieldError named by
// names (a CreateRequest field path to the edge's name for it), or err as
// it is when it is no FieldError or names has no name for its field.
func RenameField(err error, names map[string]string) error {
	var fe *FieldError
	if !errors.As(err, &fe) {
		return err
	}
	name, ok := names[fe.Field]
	if !ok {
		return err
	}
	return &FieldError{Field: name, Detail: fe.Detail}
}

var templateNamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// ValidTemplateName reports whether s may name a template.
func ValidTemplateName(s string) bool { return templateNamePattern.MatchString(s) }

// validate checks every field of a create request and returns the
// configuration with defaults applied. These are the session's own
// invariants, whichever edge the request came through: an edge checks
// only what is its wire's (its field names, its units' ranges).
func validate(req *CreateRequest, d Defaults, caps Resources) (*Config, error) {
	if req.ID != "" && !ValidID(req.ID) {
		return nil, fieldErr("ID", " %q: want 1-128 characters of [A-Za-z0-9._-], starting with a letter or digit, without \"..\"", req.ID)
	}
	if req.Template != "" && !ValidTemplateName(req.Template) {
		return nil, fieldErr("Template", " %q is not a template name ([a-z0-9-], at most 63 characters)", req.Template)
	}
	c := &Config{
		TTL: int64(d.TTL / time.Second), IdleTimeout: int64(d.IdleTimeout / time.Second),
		HibernateTimeout: int64(d.HibernateTimeout / time.Second), Network: "none", WarmUp: req.WarmUp,
	}
	for _, p := range []struct {
		field string
		v     time.Duration
		c     *int64
	}{{"TTL", req.TTL, &c.TTL}, {"IdleTimeout", req.IdleTimeout, &c.IdleTimeout}, {"HibernateTimeout", req.HibernateTimeout, &c.HibernateTimeout}} {
		switch {
		case p.v < 0 || p.v > MaxTTL:
			return nil, fieldErr(p.field, " %v: want 1s..%v (0 for the default, %v)", p.v, MaxTTL, time.Duration(*p.c)*time.Second)
		case p.v > 0:
			// Whole seconds, as the store keeps them; a part of one is
			// one more, so that a period asked for is never cut short
			// to nothing.
			*p.c = int64((p.v + time.Second - 1) / time.Second)
		}
	}
	r := req.Resources
	caps = CapResources(caps)
	if math.IsNaN(r.CPU) || r.CPU < 0 || r.CPU > caps.CPU || (r.CPU > 0 && r.CPU < 0.01) {
		return nil, fieldErr("Resources.CPU", " %v: want 0.01..%v cores (this server's limit for one session)", r.CPU, caps.CPU)
	}
	if r.MemoryMB != 0 && (r.MemoryMB < minMemoryMB || r.MemoryMB > caps.MemoryMB) {
		return nil, fieldErr("Resources.MemoryMB", " %d: want %d..%d MiB (this server's limit for one session)", r.MemoryMB, minMemoryMB, caps.MemoryMB)
	}
	if r.DiskMB != 0 && (r.DiskMB < minDiskMB || r.DiskMB > caps.DiskMB) {
		return nil, fieldErr("Resources.DiskMB", " %d: want %d..%d MiB (this server's limit for one session, at most what its workspace file system holds)", r.DiskMB, minDiskMB, caps.DiskMB)
	}
	c.Resources = r
	if len(req.Env) > maxEnvVars {
		return nil, fieldErr("Env", ": %d variables, at most %d", len(req.Env), maxEnvVars)
	}
	size := 0
	for k, v := range req.Env {
		if !envNamePattern.MatchString(k) {
			return nil, fieldErr("Env", ": %q is not a variable name ([A-Za-z_][A-Za-z0-9_]*)", k)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return nil, fieldErr("Env", ": the value of %s contains NUL", k)
		}
		size += len(k) + len(v)
	}
	if size > maxEnvBytes {
		return nil, fieldErr("Env", ": %d bytes, at most %d", size, maxEnvBytes)
	}
	c.Env = req.Env
	switch req.Network {
	case "", "none":
	default:
		return nil, fieldErr("Network", " %q: only \"none\" is supported (sandboxes have loopback only)", req.Network)
	}
	if len(req.Metadata) > maxMetadata {
		return nil, fieldErr("Metadata", ": %d keys, at most %d", len(req.Metadata), maxMetadata)
	}
	for k, v := range req.Metadata {
		if !metaKeyPattern.MatchString(k) {
			return nil, fieldErr("Metadata", ": key %q: want 1-64 characters of [A-Za-z0-9._-]", k)
		}
		if len(v) > maxMetadataValue || strings.IndexByte(v, 0) >= 0 {
			return nil, fieldErr("Metadata", ": the value of %s must be at most %d bytes without NUL", k, maxMetadataValue)
		}
	}
	up := UploadConfig{MaxFileSize: defaultMaxFileSize, MaxFileSizeUnit: "MB", MaxFileCount: defaultMaxFileCount}
	u := req.Upload
	switch u.MaxFileSizeUnit {
	case "":
	case "KB", "MB", "GB":
		up.MaxFileSizeUnit = u.MaxFileSizeUnit
	default:
		return nil, fieldErr("Upload.MaxFileSizeUnit", " %q: want KB, MB or GB", u.MaxFileSizeUnit)
	}
	if u.MaxFileSize < 0 {
		return nil, fieldErr("Upload.MaxFileSize", " %d must not be negative", u.MaxFileSize)
	}
	if u.MaxFileSize > 0 {
		up.MaxFileSize = u.MaxFileSize
	}
	if u.MaxFileCount < 0 || u.MaxFileCount > maxFileCount {
		return nil, fieldErr("Upload.MaxFileCount", " %d: want 1..%d (0 for the default, %d)", u.MaxFileCount, maxFileCount, defaultMaxFileCount)
	}
	if u.MaxFileCount > 0 {
		up.MaxFileCount = u.MaxFileCount
	}
	if len(u.AllowedFileTypes) > maxFileTypes {
		return nil, fieldErr("Upload.AllowedFileTypes", ": %d entries, at most %d", len(u.AllowedFileTypes), maxFileTypes)
	}
	for _, t := range u.AllowedFileTypes {
		if !fileTypePattern.MatchString(t) {
			return nil, fieldErr("Upload.AllowedFileTypes", ": %q is neither an extension (.csv) nor a media type (text/csv, image/*)", t)
		}
		up.AllowedFileTypes = append(up.AllowedFileTypes, strings.ToLower(t))
	}
	c.Upload = up
	// The size is bounded before it is multiplied by its unit: 2^33 GB
	// is 2^63 bytes, which wraps to a negative limit.
	if up.MaxFileSize > maxFileSizeBytes>>10 || c.MaxUploadBytes() > maxFileSizeBytes {
		return nil, fieldErr("Upload.MaxFileSize", " %d %s is more than 10 GB", up.MaxFileSize, up.MaxFileSizeUnit)
	}
	return c, nil
}

// AllowsFile reports whether an upload of this name and media type passes
// the session's allowed_file_types.
func (c *Config) AllowsFile(name, mediaType string) bool {
	if len(c.Upload.AllowedFileTypes) == 0 {
		return true
	}
	ext := strings.ToLower(strings.TrimPrefix(path.Ext(name), "."))
	mt := strings.ToLower(strings.TrimSpace(strings.Split(mediaType, ";")[0]))
	for _, t := range c.Upload.AllowedFileTypes {
		switch {
		case strings.HasSuffix(t, "/*"):
			if strings.HasPrefix(mt, strings.TrimSuffix(t, "*")) {
				return true
			}
		case strings.Contains(t, "/"):
			if mt == t {
				return true
			}
		case ext != "" && strings.TrimPrefix(t, ".") == ext:
			return true
		}
	}
	return false
}

// CapResources is what one session may ask for: caps, whose zero fields
// (and fields past them) are the built-in maxima.
func CapResources(caps Resources) Resources {
	if caps.CPU <= 0 || caps.CPU > maxCPU {
		caps.CPU = maxCPU
	}
	if caps.MemoryMB <= 0 || caps.MemoryMB > maxMemoryMB {
		caps.MemoryMB = maxMemoryMB
	}
	if caps.DiskMB <= 0 || caps.DiskMB > maxDiskMB {
		caps.DiskMB = maxDiskMB
	}
	return caps
}
