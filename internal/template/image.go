package template

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// A template build is named to runtimes as an OCI image reference,
// sbx/NAME:HASH: the form a registry serves it under once builds are
// exported as images (issue 22, part 2, prefixes the registry's host),
// and what the oci runtime resolves to the build's rootfs here
// (Store.ImageRootfs). The build hash alone says which build it is; the
// name is there for people and registries, and two names of one build
// are one image.
const imageRepoPrefix = "sbx/"

// maxImageRef bounds an image reference a resolver reads. An OCI
// repository name is at most 255 characters; ours are far shorter.
const maxImageRef = 255

// imageRefRE is the form ImageRef makes: an OCI path component (no
// trailing, leading or doubled separator other than hyphens) and a full
// build hash as the tag.
var imageRefRE = regexp.MustCompile(`^sbx/[a-z0-9]+(?:-+[a-z0-9]+)*:([0-9a-f]{64})$`)

// ImageRef is the image reference of the build hash of a template called
// name. A template name may end in a hyphen, which an OCI repository
// name may not: such hyphens are left out.
func ImageRef(name, hash string) string {
	name = strings.TrimRight(name, "-")
	if name == "" {
		name = "template"
	}
	return imageRepoPrefix + name + ":" + hash
}

// Image is t's image reference.
func (t *Template) Image() string { return ImageRef(t.Spec.Name, t.Hash) }

// ParseImageRef returns the build hash of an image reference ImageRef
// made; errdefs.ErrInvalidArgument for anything else.
func ParseImageRef(ref string) (string, error) {
	if len(ref) > maxImageRef {
		return "", fmt.Errorf("image reference of %d bytes: at most %d: %w", len(ref), maxImageRef, errdefs.ErrInvalidArgument)
	}
	m := imageRefRE.FindStringSubmatch(ref)
	if m == nil {
		return "", fmt.Errorf("image reference %q: want sbx/NAME:HASH (a template build's full hash): %w", ref, errdefs.ErrInvalidArgument)
	}
	return m[1], nil
}

// ImageRootfs resolves an image reference (ImageRef) to its build's root
// filesystem: the oci runtime's image resolver. Only a full hash
// resolves, never a prefix (Get's convenience for people).
func (s *Store) ImageRootfs(ctx context.Context, ref string) (string, error) {
	hash, err := ParseImageRef(ref)
	if err != nil {
		return "", err
	}
	dir := s.path("builds", hash, "rootfs")
	if _, err := os.Stat(filepath.Join(s.path("builds", hash), "build.json")); err != nil {
		return "", fmt.Errorf("image %q: no such template build: %w", ref, errdefs.ErrNotFound)
	}
	return dir, nil
}
