package template

import (
	"maps"
	"slices"
	"time"

	"github.com/sbx-sandbox/sbx/internal/runtime"
)

// builtins are the templates every sbx knows by name. They are kept lean:
// every package costs disk on every node and, through the page cache, start
// time. Debian's package names are for bookworm.
var builtins = []Spec{
	{
		// The smallest useful template: the executor needs only python3.
		// Most tests use it.
		Name:    "python",
		Timeout: Duration(30 * time.Second),
	},
	{
		Name: "python-datascience",
		Packages: []string{
			"python3-numpy", "python3-pandas", "python3-matplotlib", "python3-scipy",
		},
		// python3-scipy Depends on python3-pythran, which Depends on g++,
		// libboost-dev, python3-all-dev, libopenblas-dev and libxsimd-dev:
		// about 1 GB of compilers and headers. Pythran is a compiler: scipy
		// runs its pythran-built modules as ordinary extension modules,
		// compiled when Debian built the package, and never imports pythran.
		// The dependency is there only so that users can compile their own
		// pythran code (scipy 1.8.1-5 changelog), and Debian itself demoted
		// it to Suggests on armhf, where scipy works without it. Nothing in
		// a sandbox can compile anything, so a placeholder is safe.
		//
		// python3-fonttools (for matplotlib) Depends on unicode-data, 37 MB
		// of Unicode Character Database text. fontTools' own tables
		// (fontTools/unicodedata/*.py) are generated from it when Debian
		// builds the package, and nothing reads /usr/share/unicode at run
		// time, so it is a build input too.
		//
		// fonttools also Depends on python3-sympy (120 MB with bytecode) for
		// fontTools.misc.symfont, which matplotlib never imports. That one is
		// a real runtime library, and agents do use sympy, so it stays.
		Stubs:     []string{"python3-pythran", "unicode-data"},
		Env:       map[string]string{"MPLBACKEND": "Agg"},
		Resources: runtime.Resources{MemoryMB: 1024},
		Timeout:   Duration(120 * time.Second),
		Preload:   []string{"numpy", "pandas", "matplotlib", "matplotlib.pyplot"},
	},
	{
		// Reading what users upload: spreadsheets, Word documents, PDFs
		// (text with pypdf, pages as images with poppler's pdftoppm) and
		// scanned images (tesseract, English).
		Name: "file-parser",
		Packages: []string{
			"python3-pandas", "python3-openpyxl", "python3-docx", "python3-pypdf",
			"poppler-utils", "tesseract-ocr", "tesseract-ocr-eng",
		},
		Resources: runtime.Resources{MemoryMB: 1024},
		Timeout:   Duration(120 * time.Second),
		Preload:   []string{"pandas", "openpyxl", "docx", "pypdf"},
	},
}

// Builtins returns the built-in templates' specs.
func Builtins() []Spec {
	out := make([]Spec, len(builtins))
	for i, s := range builtins {
		out[i] = s.clone()
	}
	return out
}

// Builtin returns the built-in template called name.
func Builtin(name string) (Spec, bool) {
	for _, s := range builtins {
		if s.Name == name {
			return s.clone(), true
		}
	}
	return Spec{}, false
}

// clone returns a deep copy, so that callers can change what they got
// without changing the built-ins.
func (s Spec) clone() Spec {
	s.Packages = slices.Clone(s.Packages)
	s.Stubs = slices.Clone(s.Stubs)
	s.Preload = slices.Clone(s.Preload)
	s.Env = maps.Clone(s.Env)
	s.Files = maps.Clone(s.Files)
	return s
}
