package template

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// The mirrors in these tests are made up (.example is reserved): the
// builder must never assume a particular mirror.
const (
	sampleList = `# a comment
deb-src http://src.example/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] http://mirror.example/debian/ bookworm main contrib
deb [ trusted=yes ] http://mirror.example/debian bookworm-updates main   # trailing comment
deb http://security.example/debian-security bookworm-security main
deb http://other.example/apt cloud-sdk main
deb broken
`
	sampleDeb822 = `# leading comment
Types: deb deb-src
# snapshot comment inside a paragraph
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://security.example/debian-security
Suites:
 bookworm-security
Components: main non-free-firmware

Types: deb
Enabled: no
URIs: http://disabled.example/debian
Suites: trixie

Types: deb-src
URIs: http://src.example/debian
Suites: trixie
`
)

func TestParseSourcesList(t *testing.T) {
	got := parseSourcesList(sampleList)
	want := []aptSource{
		{URI: "http://mirror.example/debian/", Suites: []string{"bookworm"}, Components: []string{"main", "contrib"}},
		{URI: "http://mirror.example/debian", Suites: []string{"bookworm-updates"}, Components: []string{"main"}},
		{URI: "http://security.example/debian-security", Suites: []string{"bookworm-security"}, Components: []string{"main"}},
		{URI: "http://other.example/apt", Suites: []string{"cloud-sdk"}, Components: []string{"main"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseSourcesList:\n got %+v\nwant %+v", got, want)
	}
}

func TestParseDeb822(t *testing.T) {
	got := parseDeb822(sampleDeb822)
	want := []aptSource{
		{URI: "http://mirror.example/debian", Suites: []string{"bookworm", "bookworm-updates"}, Components: []string{"main"}},
		{URI: "http://security.example/debian-security", Suites: []string{"bookworm-security"}, Components: []string{"main", "non-free-firmware"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseDeb822:\n got %+v\nwant %+v", got, want)
	}
}

func TestMirrorFor(t *testing.T) {
	srcs := append(parseSourcesList("deb http://first.example/apt cloud-sdk main\n"), parseDeb822(sampleDeb822)...)
	tests := []struct {
		release, want string
		ok            bool
	}{
		{"bookworm", "http://mirror.example/debian", true},
		// No trixie entry: a Debian mirror carries every release.
		{"trixie", "http://mirror.example/debian", true},
	}
	for _, tt := range tests {
		got, err := mirrorFor(srcs, tt.release)
		if err != nil || got != tt.want {
			t.Errorf("mirrorFor(%s) = %q, %v; want %q", tt.release, got, err, tt.want)
		}
	}
	// The first entry naming the release wins, even after other suites.
	srcs = parseSourcesList("deb http://a.example/debian bookworm-security main\ndeb http://b.example/debian/ bookworm main\n")
	if got, _ := mirrorFor(srcs, "bookworm"); got != "http://b.example/debian" {
		t.Errorf("mirrorFor = %q, want http://b.example/debian", got)
	}
	if _, err := mirrorFor(parseSourcesList("deb http://x.example/apt stable main\n"), "bookworm"); err == nil {
		t.Error("mirrorFor found a mirror where there is none")
	}
}

func TestChrootSources(t *testing.T) {
	srcs := parseDeb822(sampleDeb822)
	got := chrootSources(srcs, "bookworm", "http://mirror.example/debian", false)
	want := "deb http://mirror.example/debian bookworm main\n" +
		"deb http://mirror.example/debian bookworm-updates main\n" +
		"deb http://security.example/debian-security bookworm-security main non-free-firmware\n"
	if got != want {
		t.Errorf("host sources:\n got %q\nwant %q", got, want)
	}
	if got := chrootSources(srcs, "bookworm", "http://own.example/d", true); got != "deb http://own.example/d bookworm main\n" {
		t.Errorf("explicit mirror: %q", got)
	}
	if got := chrootSources(srcs, "trixie", "http://mirror.example/debian", false); got != "deb http://mirror.example/debian trixie main\n" {
		t.Errorf("release the host lacks: %q", got)
	}
}

func TestReadAptSources(t *testing.T) {
	root := t.TempDir()
	d := filepath.Join(root, "etc/apt/sources.list.d")
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"etc/apt/sources.list":                   "deb http://one.example/debian bookworm main\n",
		"etc/apt/sources.list.d/b.sources":       "Types: deb\nURIs: http://three.example/debian\nSuites: trixie\n",
		"etc/apt/sources.list.d/a.list":          "deb http://two.example/debian bookworm main\n",
		"etc/apt/sources.list.d/c.list.save":     "deb http://ignored.example/debian bookworm main\n",
		"etc/apt/sources.list.d/d.list.disabled": "deb http://ignored.example/debian bookworm main\n",
	}
	for p, c := range files {
		if err := os.WriteFile(filepath.Join(root, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	srcs, err := readAptSources(root)
	if err != nil {
		t.Fatal(err)
	}
	var uris []string
	for _, s := range srcs {
		uris = append(uris, s.URI)
	}
	want := []string{"http://one.example/debian", "http://two.example/debian", "http://three.example/debian"}
	if !reflect.DeepEqual(uris, want) {
		t.Errorf("readAptSources: %v, want %v", uris, want)
	}
	if srcs, err := readAptSources(t.TempDir()); err != nil || len(srcs) != 0 {
		t.Errorf("no apt configuration: %v, %v", srcs, err)
	}
}

func FuzzParseSources(f *testing.F) {
	f.Add(sampleList)
	f.Add(sampleDeb822)
	f.Fuzz(func(t *testing.T, text string) {
		for _, s := range append(parseSourcesList(text), parseDeb822(text)...) {
			if s.URI == "" || len(s.Suites) == 0 {
				t.Fatalf("entry without URI or suite: %+v", s)
			}
		}
	})
}
