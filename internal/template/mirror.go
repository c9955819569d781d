package template

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// The Debian mirror is never written into sbx: machines that build
// templates reach a mirror of their own choosing (a local one, a snapshot,
// a proxy), and their apt configuration already says which. So the mirror
// comes from Store.Mirror, else SBX_DEBIAN_MIRROR, else the host's apt
// sources.

// aptSource is one "deb" entry of an apt configuration.
type aptSource struct {
	URI        string
	Suites     []string
	Components []string
}

// readAptSources reads the deb entries of the apt configuration under root
// ("/" on a real host): sources.list, then sources.list.d/*.list and
// *.sources in name order, as apt reads them.
func readAptSources(root string) ([]aptSource, error) {
	dir := filepath.Join(root, "etc/apt")
	var out []aptSource
	b, err := os.ReadFile(filepath.Join(dir, "sources.list"))
	switch {
	case err == nil:
		out = append(out, parseSourcesList(string(b))...)
	case !errors.Is(err, os.ErrNotExist):
		return nil, err
	}
	entries, err := os.ReadDir(filepath.Join(dir, "sources.list.d"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, e := range entries { // ReadDir sorts by name
		name := e.Name()
		if e.IsDir() || !(strings.HasSuffix(name, ".list") || strings.HasSuffix(name, ".sources")) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, "sources.list.d", name))
		if err != nil {
			return nil, err
		}
		if strings.HasSuffix(name, ".list") {
			out = append(out, parseSourcesList(string(b))...)
		} else {
			out = append(out, parseDeb822(string(b))...)
		}
	}
	return out, nil
}

// parseSourcesList reads the one-line format:
// "deb [option=value ...] URI SUITE [COMPONENT ...]".
func parseSourcesList(text string) []aptSource {
	var out []aptSource
	for _, line := range strings.Split(text, "\n") {
		line, _, _ = strings.Cut(line, "#")
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if len(f) > 0 && strings.HasPrefix(f[0], "[") {
			// Options may be written "[a=b c=d]" or "[ a=b ]".
			end := slices.IndexFunc(f, func(s string) bool { return strings.HasSuffix(s, "]") })
			if end < 0 {
				continue
			}
			f = f[end+1:]
		}
		if len(f) < 2 {
			continue
		}
		out = append(out, aptSource{URI: f[0], Suites: []string{f[1]}, Components: slices.Clone(f[2:])})
	}
	return out
}

// parseDeb822 reads the deb822 format of *.sources files: paragraphs of
// "Field: value" lines separated by blank lines.
func parseDeb822(text string) []aptSource {
	var out []aptSource
	fields := map[string]string{}
	last := ""
	flush := func() {
		defer func() { fields, last = map[string]string{}, "" }()
		if strings.EqualFold(fields["enabled"], "no") || !slices.Contains(strings.Fields(fields["types"]), "deb") {
			return
		}
		uris, suites := strings.Fields(fields["uris"]), strings.Fields(fields["suites"])
		if len(uris) == 0 || len(suites) == 0 {
			return
		}
		out = append(out, aptSource{URI: uris[0], Suites: suites, Components: strings.Fields(fields["components"])})
	}
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, "#"):
			continue
		case strings.TrimSpace(line) == "":
			flush()
		case line[0] == ' ' || line[0] == '\t':
			if last != "" {
				fields[last] += " " + strings.TrimSpace(line)
			}
		default:
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			last = strings.ToLower(strings.TrimSpace(k))
			fields[last] = strings.TrimSpace(v)
		}
	}
	flush()
	return out
}

// mirrorFor picks the mirror to debootstrap release from: the first entry
// whose suites include the release itself. A machine configured for one
// release can still build another (a Debian mirror carries them all), so
// failing that, the first entry for any known release.
func mirrorFor(srcs []aptSource, release string) (string, error) {
	for _, s := range srcs {
		if slices.Contains(s.Suites, release) {
			return strings.TrimSuffix(s.URI, "/"), nil
		}
	}
	for _, s := range srcs {
		for _, r := range releases {
			if slices.Contains(s.Suites, r) {
				return strings.TrimSuffix(s.URI, "/"), nil
			}
		}
	}
	return "", fmt.Errorf("no Debian mirror for %s in the apt configuration; set SBX_DEBIAN_MIRROR", release)
}

// chrootSources is the sources.list a build installs packages from. It
// keeps the host's entries for the release and its -updates and -security
// suites, so that templates get the fixes the host gets; when the mirror
// was given explicitly, or the host has no entry for this release, it is
// the mirror alone.
func chrootSources(srcs []aptSource, release, mirror string, explicit bool) string {
	var b strings.Builder
	hasRelease := false
	for _, s := range srcs {
		for _, suite := range s.Suites {
			if explicit || (suite != release && suite != release+"-updates" && suite != release+"-security") {
				continue
			}
			hasRelease = hasRelease || suite == release
			comps := s.Components
			if len(comps) == 0 {
				comps = []string{"main"}
			}
			fmt.Fprintf(&b, "deb %s %s %s\n", s.URI, suite, strings.Join(comps, " "))
		}
	}
	if !hasRelease {
		return fmt.Sprintf("deb %s %s main\n", mirror, release)
	}
	return b.String()
}
