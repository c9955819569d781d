package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/image"
	"github.com/sbx-sandbox/sbx/internal/runtime/oci"
	"github.com/sbx-sandbox/sbx/internal/template"
)

const imageUsage = `usage: sbx image COMMAND [flags]

commands:
  build (--template NAME[:HASH] | --dir DIR) [--add SRC:/DST[:MODE]]...
        [--entrypoint CMD] --tag REF (-o FILE | --push [--insecure])
      make an OCI image: a template build's rootfs with the executor on top
      (entrypoint the executor), or DIR as the image's root (every file
      root's) with each --add'ed file in a layer above it. -o writes a
      docker-archive tarball (docker load, ctr images import); --push
      pushes REF.
  push --registry HOST[/PREFIX] --template NAME[:HASH] [--insecure]
      push a template build as HOST[/PREFIX]/sbx/NAME:HASH, the reference
      a cluster runs its sessions from.

flags:
  --data-dir DIR    sbx's data directory (default $SBX_DATA_DIR, else /var/lib/sbx)
  --executor PATH   the static sbx-executor (default: beside sbx, then PATH)
  --entrypoint CMD  a path, or a JSON array of strings
  --insecure        allow plain HTTP to the registry (a local one); without
                    it every request is HTTPS
Registry credentials come from the docker config (~/.docker/config.json).
`

func runImage(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, imageUsage)
		return 2
	}
	switch args[0] {
	case "build":
		return imageBuild(ctx, args[1:], stdout, stderr)
	case "push":
		return imagePush(ctx, args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, imageUsage)
		return 0
	default:
		fmt.Fprintf(stderr, "sbx image: unknown command %q\n\n%s", args[0], imageUsage)
		return 2
	}
}

type addFlags []image.File

func (a *addFlags) String() string { return fmt.Sprint(len(*a)) }
func (a *addFlags) Set(s string) error {
	f, err := image.ParseAdd(s)
	if err != nil {
		return err
	}
	*a = append(*a, f)
	return nil
}

func imageFlags(name string, stderr io.Writer) (*flag.FlagSet, *string, *string, *string, *bool) {
	fs := flag.NewFlagSet("image "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, imageUsage) }
	dir := fs.String("data-dir", dataDir(), "sbx's data `dir`")
	tmpl := fs.String("template", "", "the template `NAME[:HASH]`")
	exe := fs.String("executor", "", "the static sbx-executor `path`")
	insecure := fs.Bool("insecure", false, "allow plain HTTP to the registry")
	return fs, dir, tmpl, exe, insecure
}

func imageBuild(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, dir, tmpl, exe, insecure := imageFlags("build", stderr)
	root := fs.String("dir", "", "a `dir` as the image's root")
	var adds addFlags
	fs.Var(&adds, "add", "add a file `SRC:/DST[:MODE]`")
	entry := fs.String("entrypoint", "", "the entrypoint: a path or a JSON array")
	tagFlag := fs.String("tag", "", "the image `reference`")
	out := fs.String("o", "", "write a docker-archive tarball to `file`")
	push := fs.Bool("push", false, "push the image to its reference's registry")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	usage := func(msg string) int {
		fmt.Fprintln(stderr, "sbx image build:", msg)
		return 2
	}
	switch {
	case fs.NArg() > 0:
		return usage(fmt.Sprintf("unexpected arguments %q", fs.Args()))
	case (*tmpl == "") == (*root == ""):
		return usage("one of --template and --dir")
	case *tagFlag == "" && *tmpl == "":
		return usage("--tag is required with --dir")
	case (*out == "") == !*push:
		return usage("one of -o FILE and --push")
	}
	if *tagFlag == "" {
		// What the kubernetes runtime pulls for the template (TemplateTag).
		t, _, err := findTemplate(*dir, *tmpl)
		if err != nil {
			return imageFail(stderr, "build", err)
		}
		exePath, err := executorPath(*exe)
		if err != nil {
			return imageFail(stderr, "build", err)
		}
		if *tagFlag, err = templateTag("", t.Image(), exePath); err != nil {
			return imageFail(stderr, "build", err)
		}
	}
	tag, err := image.ParseTag(*tagFlag)
	if err != nil {
		return usage(err.Error())
	}
	var img *image.Image
	start := time.Now()
	if *tmpl != "" {
		if len(adds) > 0 || *entry != "" {
			return usage("--add and --entrypoint go with --dir; a template's image runs the executor")
		}
		img, err = templateImage(ctx, *dir, *tmpl, *exe)
	} else {
		var cfg image.Config
		if cfg.Entrypoint, err = parseEntrypoint(*entry); err != nil {
			return usage(err.Error())
		}
		layers := []image.LayerSpec{{Tree: *root}}
		if len(adds) > 0 {
			layers = append(layers, image.LayerSpec{Files: adds})
		}
		img, err = image.Build(ctx, "", layers, cfg)
	}
	if err != nil {
		return imageFail(stderr, "build", err)
	}
	defer img.Close()
	if *out != "" {
		err = image.WriteArchiveFile(*out, tag, img)
	} else {
		err = image.Push(ctx, tag, img, image.PushOptions{Insecure: *insecure})
	}
	if err != nil {
		return imageFail(stderr, "build", err)
	}
	d, err := img.Digest()
	if err != nil {
		return imageFail(stderr, "build", err)
	}
	fmt.Fprintf(stdout, "%s %s %s\n", tag, d, time.Since(start).Round(time.Millisecond))
	return 0
}

func imagePush(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, dir, tmpl, exe, insecure := imageFlags("push", stderr)
	reg := fs.String("registry", "", "the registry `HOST[/PREFIX]`")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 || *reg == "" || *tmpl == "" {
		fmt.Fprintln(stderr, "sbx image push: --registry and --template are required")
		return 2
	}
	t, store, err := findTemplate(*dir, *tmpl)
	if err != nil {
		return imageFail(stderr, "push", err)
	}
	exePath, err := executorPath(*exe)
	if err != nil {
		return imageFail(stderr, "push", err)
	}
	ref, err := templateTag(*reg, t.Image(), exePath)
	if err != nil {
		return imageFail(stderr, "push", err)
	}
	tag, err := image.ParseTag(ref)
	if err != nil {
		fmt.Fprintln(stderr, "sbx image push:", err)
		return 2
	}
	img, err := image.Template(ctx, "", store, t, exePath)
	if err != nil {
		return imageFail(stderr, "push", err)
	}
	defer img.Close()
	if err := image.Push(ctx, tag, img, image.PushOptions{Insecure: *insecure}); err != nil {
		return imageFail(stderr, "push", err)
	}
	d, err := img.Digest()
	if err != nil {
		return imageFail(stderr, "push", err)
	}
	fmt.Fprintf(stdout, "%s %s\n", tag, d)
	return 0
}

func imageFail(stderr io.Writer, cmd string, err error) int {
	fmt.Fprintf(stderr, "sbx image %s: %v\n", cmd, err)
	if errors.Is(err, errdefs.ErrInvalidArgument) {
		return 2
	}
	return 1
}

// findTemplate resolves NAME or NAME:HASH (a hash prefix will do) to a
// build of the local store.
func findTemplate(dataDir, ref string) (*template.Template, *template.Store, error) {
	store := template.NewStore(filepath.Join(dataDir, "templates"))
	name, hash, ok := strings.Cut(ref, ":")
	if ok {
		t, err := store.Get(hash)
		if err != nil {
			return nil, nil, err
		}
		t.Spec.Name = name
		return t, store, nil
	}
	spec, err := store.Named(name)
	if err != nil {
		return nil, nil, err
	}
	t, found := store.Lookup(spec)
	if !found {
		return nil, nil, fmt.Errorf("template %q: %w (sbx template build %s)", name, template.ErrNotBuilt, name)
	}
	return t, store, nil
}

func templateImage(ctx context.Context, dataDir, ref, exe string) (*image.Image, error) {
	t, store, err := findTemplate(dataDir, ref)
	if err != nil {
		return nil, err
	}
	exePath, err := executorPath(exe)
	if err != nil {
		return nil, err
	}
	return image.Template(ctx, "", store, t, exePath)
}

// templateTag is the reference the kubernetes runtime pulls for a
// template image holding executor: [REGISTRY/]sbx/NAME:HASH-xEXEC.
func templateTag(registry, ref, executor string) (string, error) {
	suffix, err := image.ExecutorSuffix(executor)
	if err != nil {
		return "", err
	}
	if registry != "" {
		ref = strings.TrimSuffix(registry, "/") + "/" + ref
	}
	return ref + suffix, nil
}

// executorPath is the executor a template image holds: the flag's, else
// the one beside sbx, else PATH's (as the oci runtime finds it).
func executorPath(flagValue string) (string, error) {
	if flagValue != "" {
		return flagValue, nil
	}
	return oci.FindExecutor()
}

func parseEntrypoint(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	if !strings.HasPrefix(s, "[") {
		return []string{s}, nil
	}
	var out []string
	if err := json.Unmarshal([]byte(s), &out); err != nil || len(out) == 0 {
		return nil, fmt.Errorf("--entrypoint %q: want a path or a JSON array of strings", s)
	}
	return out, nil
}
