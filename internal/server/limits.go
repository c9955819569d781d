package server

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/internal/session"
)

// ParseLimits applies "name=value,..." to base: sessions, sandboxes,
// memory (MiB, or with a G suffix GiB), cpu (cores), disk (MiB or G),
// history (executions kept per session), history_size (MiB or G that the
// tenant's executions take in the metadata store), snapshots (kept per
// session), stored (MiB or G in the blob store), streams (open of each
// long-lived kind), chats (chat turns at once) and chat_tokens (model
// tokens an hour). 0 is no bound.
func ParseLimits(spec string, base session.Limits) (session.Limits, error) {
	l := base
	for _, f := range strings.Split(spec, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		name, v, ok := strings.Cut(f, "=")
		if !ok {
			return l, fmt.Errorf("limit %q: want NAME=VALUE", f)
		}
		var err error
		switch name {
		case "sessions":
			l.Sessions, err = count(v)
		case "sandboxes":
			l.Sandboxes, err = count(v)
		case "history":
			l.History, err = count(v)
		case "history_size":
			if l.HistoryMB, err = mebibytes(v); err == nil && l.HistoryMB > 0 && l.HistoryMB < MinHistoryMB {
				err = fmt.Errorf("want at least %d MiB (the newest executions' records, whole), or 0", MinHistoryMB)
			}
		case "snapshots":
			l.Snapshots, err = count(v)
		case "memory":
			l.MemoryMB, err = mebibytes(v)
		case "disk":
			l.DiskMB, err = mebibytes(v)
		case "stored":
			l.StoredMB, err = mebibytes(v)
		case "cpu":
			l.CPU, err = cores(v)
		case "streams":
			l.Streams, err = count(v)
		case "chats":
			l.Chats, err = count(v)
		case "chat_tokens":
			l.ChatTokens, err = tokens(v)
		default:
			return l, fmt.Errorf("limit %q: unknown; want sessions, sandboxes, memory, cpu, disk, history, history_size, snapshots, stored, streams, chats or chat_tokens", name)
		}
		if err != nil {
			return l, fmt.Errorf("limit %s: %w", f, err)
		}
	}
	return l, nil
}

// MinHistoryMB is the least history_size: room for a few of the largest
// records (execution.MaxRecordBytes).
const MinHistoryMB = 16

// ParseTenantLimits reads TENANT:name=value,... specs: each tenant named
// gets defaults with its own values applied.
func ParseTenantLimits(specs []string, defaults session.Limits) (map[string]session.Limits, error) {
	out := map[string]session.Limits{}
	for _, spec := range specs {
		tenant, rest, ok := strings.Cut(strings.TrimSpace(spec), ":")
		if !ok || !tenantPattern.MatchString(tenant) {
			return nil, fmt.Errorf("tenant limit %q: want TENANT:NAME=VALUE[,NAME=VALUE]", spec)
		}
		base, seen := out[tenant]
		if !seen {
			base = defaults
		}
		l, err := ParseLimits(rest, base)
		if err != nil {
			return nil, fmt.Errorf("tenant %s: %w", tenant, err)
		}
		out[tenant] = l
	}
	return out, nil
}

// ParseSessionMax reads "cpu=C,memory=M,disk=D" (memory and disk in MiB,
// or with a G suffix GiB): what one session may ask for.
func ParseSessionMax(spec string) (api.Resources, error) {
	var r api.Resources
	for _, f := range strings.Split(spec, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		name, v, _ := strings.Cut(f, "=")
		var err error
		switch name {
		case "cpu":
			r.CPU, err = cores(v)
		case "memory":
			r.Memory, err = mebibytes(v)
		case "disk":
			r.Disk, err = mebibytes(v)
		default:
			return r, fmt.Errorf("session maximum %q: want cpu, memory or disk", f)
		}
		if err != nil {
			return r, fmt.Errorf("session maximum %s: %w", f, err)
		}
	}
	return r, nil
}

func count(v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("want a whole number, 0 or more")
	}
	return n, nil
}

func mebibytes(v string) (int64, error) {
	mult := int64(1)
	if s, ok := strings.CutSuffix(strings.ToUpper(v), "G"); ok {
		v, mult = s, 1024
	} else if s, ok := strings.CutSuffix(strings.ToUpper(v), "M"); ok {
		v = s
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("want MiB (or NG for GiB), 0 or more")
	}
	return n * mult, nil
}

// tokens reads a count of model tokens, with a K or M suffix for
// thousands or millions.
func tokens(v string) (int64, error) {
	mult := int64(1)
	switch {
	case strings.HasSuffix(strings.ToUpper(v), "K"):
		v, mult = v[:len(v)-1], 1000
	case strings.HasSuffix(strings.ToUpper(v), "M"):
		v, mult = v[:len(v)-1], 1000*1000
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("want tokens (or NK, NM for thousands, millions), 0 or more")
	}
	return n * mult, nil
}

func cores(v string) (float64, error) {
	c, err := strconv.ParseFloat(v, 64)
	if err != nil || c < 0 || math.IsNaN(c) || math.IsInf(c, 0) {
		return 0, fmt.Errorf("want cores, 0 or more")
	}
	return c, nil
}
