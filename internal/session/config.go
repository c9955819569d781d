package session

import (
	"fmt"
	"math"
	"path"
	"regexp"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/api"
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

// Config is what a session was created with, after validation and
// defaults. It is kept in the store as JSON.
type Config struct {
	TTL         int64 `json:"ttl"`          // seconds
	IdleTimeout int64 `json:"idle_timeout"` // seconds
	// HibernateTimeout is the idle time, in seconds, after which the
	// session is hibernated; 0 in records older than the field means the
	// server's default.
	HibernateTimeout int64 `json:"hibernate_timeout,omitempty"`
	// WarmUp asks for a sandbox at create rather than at the first
	// execution.
	WarmUp    bool                 `json:"warm_up,omitempty"`
	Resources api.Resources        `json:"resources"`
	Env       map[string]string    `json:"env,omitempty"`
	Network   string               `json:"network"`
	Upload    api.FileUploadConfig `json:"upload"`
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

// validate checks every field of a create request and returns the
// configuration with defaults applied.
func validate(req *api.CreateSessionRequest, d Defaults, caps api.Resources) (*Config, error) {
	if req.SessionID != "" && !ValidID(req.SessionID) {
		return nil, invalid("session_id %q: want 1-128 characters of [A-Za-z0-9._-], starting with a letter or digit, without \"..\"", req.SessionID)
	}
	if req.TemplateID != "" && !regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`).MatchString(req.TemplateID) {
		return nil, invalid("template_id %q is not a template name ([a-z0-9-], at most 63 characters)", req.TemplateID)
	}
	c := &Config{
		TTL: int64(d.TTL / time.Second), IdleTimeout: int64(d.IdleTimeout / time.Second),
		HibernateTimeout: int64(d.HibernateTimeout / time.Second), Network: "none", WarmUp: req.WarmUp,
	}
	switch {
	case req.Timeout < 0 || req.Timeout > int64(MaxTTL/time.Second):
		return nil, invalid("timeout %d: the session's time to live is 1..%d seconds (0 for the default, %d)", req.Timeout, int64(MaxTTL/time.Second), c.TTL)
	case req.Timeout > 0:
		c.TTL = req.Timeout
	}
	switch {
	case req.IdleTimeout < 0 || req.IdleTimeout > int64(MaxTTL/time.Second):
		return nil, invalid("idle_timeout %d: want 1..%d seconds (0 for the default, %d)", req.IdleTimeout, int64(MaxTTL/time.Second), c.IdleTimeout)
	case req.IdleTimeout > 0:
		c.IdleTimeout = req.IdleTimeout
	}
	switch {
	case req.HibernateTimeout < 0 || req.HibernateTimeout > int64(MaxTTL/time.Second):
		return nil, invalid("hibernate_timeout %d: want 1..%d seconds (0 for the default, %d)", req.HibernateTimeout, int64(MaxTTL/time.Second), c.HibernateTimeout)
	case req.HibernateTimeout > 0:
		c.HibernateTimeout = req.HibernateTimeout
	}
	if r := req.Resources; r != nil {
		caps = CapResources(caps)
		if math.IsNaN(r.CPU) || r.CPU < 0 || r.CPU > caps.CPU || (r.CPU > 0 && r.CPU < 0.01) {
			return nil, invalid("resources.cpu %v: want 0.01..%v cores (this server's limit for one session)", r.CPU, caps.CPU)
		}
		if r.Memory != 0 && (r.Memory < minMemoryMB || r.Memory > caps.Memory) {
			return nil, invalid("resources.memory %d: want %d..%d MiB (this server's limit for one session)", r.Memory, minMemoryMB, caps.Memory)
		}
		if r.Disk != 0 && (r.Disk < minDiskMB || r.Disk > caps.Disk) {
			return nil, invalid("resources.disk %d: want %d..%d MiB (this server's limit for one session, at most what its workspace file system holds)", r.Disk, minDiskMB, caps.Disk)
		}
		c.Resources = *r
	}
	if len(req.EnvVars) > maxEnvVars {
		return nil, invalid("env_vars: %d variables, at most %d", len(req.EnvVars), maxEnvVars)
	}
	size := 0
	for k, v := range req.EnvVars {
		if !envNamePattern.MatchString(k) {
			return nil, invalid("env_vars: %q is not a variable name ([A-Za-z_][A-Za-z0-9_]*)", k)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return nil, invalid("env_vars: the value of %s contains NUL", k)
		}
		size += len(k) + len(v)
	}
	if size > maxEnvBytes {
		return nil, invalid("env_vars: %d bytes, at most %d", size, maxEnvBytes)
	}
	c.Env = req.EnvVars
	switch req.Network {
	case "", "none":
	default:
		return nil, invalid("network %q: only \"none\" is supported (sandboxes have loopback only)", req.Network)
	}
	if len(req.Metadata) > maxMetadata {
		return nil, invalid("metadata: %d keys, at most %d", len(req.Metadata), maxMetadata)
	}
	for k, v := range req.Metadata {
		if !metaKeyPattern.MatchString(k) {
			return nil, invalid("metadata: key %q: want 1-64 characters of [A-Za-z0-9._-]", k)
		}
		if len(v) > maxMetadataValue || strings.IndexByte(v, 0) >= 0 {
			return nil, invalid("metadata: the value of %s must be at most %d bytes without NUL", k, maxMetadataValue)
		}
	}
	up := api.FileUploadConfig{MaxFileSize: defaultMaxFileSize, MaxFileSizeUnit: "MB", MaxFileCount: defaultMaxFileCount}
	if u := req.FileUploadConfig; u != nil {
		switch u.MaxFileSizeUnit {
		case "":
		case "KB", "MB", "GB":
			up.MaxFileSizeUnit = u.MaxFileSizeUnit
		default:
			return nil, invalid("file_upload_config.max_file_size_unit %q: want KB, MB or GB", u.MaxFileSizeUnit)
		}
		if u.MaxFileSize < 0 {
			return nil, invalid("file_upload_config.max_file_size %d must not be negative", u.MaxFileSize)
		}
		if u.MaxFileSize > 0 {
			up.MaxFileSize = u.MaxFileSize
		}
		if u.MaxFileCount < 0 || u.MaxFileCount > maxFileCount {
			return nil, invalid("file_upload_config.max_file_count %d: want 1..%d (0 for the default, %d)", u.MaxFileCount, maxFileCount, defaultMaxFileCount)
		}
		if u.MaxFileCount > 0 {
			up.MaxFileCount = u.MaxFileCount
		}
		if len(u.AllowedFileTypes) > maxFileTypes {
			return nil, invalid("file_upload_config.allowed_file_types: %d entries, at most %d", len(u.AllowedFileTypes), maxFileTypes)
		}
		for _, t := range u.AllowedFileTypes {
			if !fileTypePattern.MatchString(t) {
				return nil, invalid("file_upload_config.allowed_file_types: %q is neither an extension (.csv) nor a media type (text/csv, image/*)", t)
			}
			up.AllowedFileTypes = append(up.AllowedFileTypes, strings.ToLower(t))
		}
	}
	c.Upload = up
	if c.MaxUploadBytes() > maxFileSizeBytes {
		return nil, invalid("file_upload_config: max_file_size %d %s is more than 10 GB", up.MaxFileSize, up.MaxFileSizeUnit)
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
func CapResources(caps api.Resources) api.Resources {
	if caps.CPU <= 0 || caps.CPU > maxCPU {
		caps.CPU = maxCPU
	}
	if caps.Memory <= 0 || caps.Memory > maxMemoryMB {
		caps.Memory = maxMemoryMB
	}
	if caps.Disk <= 0 || caps.Disk > maxDiskMB {
		caps.Disk = maxDiskMB
	}
	return caps
}
