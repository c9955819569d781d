package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime/oci"
	"github.com/sbx-sandbox/sbx/internal/template"
)

const templateUsage = `usage: sbx template COMMAND [flags] [ARGS]

commands:
  build NAME [--file spec.json]  build a template: a built-in by name, or the
                                 spec in the file (NAME names it)
  ls                             list built-in and built templates
  rm NAME|HASH                   remove a template's build

Builds are cached by content: building a template again costs nothing
unless its packages, files or release changed. The first build of a
release also makes its base layer (debootstrap, about a minute). The
Debian mirror is SBX_DEBIAN_MIRROR, else the host's apt configuration.

flags (every command):
  --data-dir DIR   sbx's data directory; templates live in DIR/templates
                   (default $SBX_DATA_DIR, else /var/lib/sbx)
  --server URL     work on a server's templates over its API instead: a
                   build there is the caller's own template, built in the
                   background, its log shown as it runs; ls lists what the
                   caller can use, rm deletes one of the caller's
  --api-key KEY    the server's API key (default $SBX_API_KEY)
  --force          rm over the API: delete even though sessions use it
`

// runTemplate implements `sbx template`. Exit status: 0 on success, 1 if
// the operation failed, 2 for a usage error.
func runTemplate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, templateUsage)
		return 2
	}
	switch args[0] {
	case "build":
		return templateBuild(ctx, args[1:], stdout, stderr)
	case "ls", "list":
		return templateList(args[1:], stdout, stderr)
	case "rm", "remove":
		return templateRemove(ctx, args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, templateUsage)
		return 0
	default:
		fmt.Fprintf(stderr, "sbx template: unknown command %q\n\n%s", args[0], templateUsage)
		return 2
	}
}

// templateFlags is the flag set every subcommand starts from; remote
// makes a client when --server was given, nil otherwise.
func templateFlags(name string, stderr io.Writer) (*flag.FlagSet, *string, func() *client.Client) {
	fs, connect := clientFlags("template "+name, templateUsage, stderr)
	dir := fs.String("data-dir", dataDir(), "sbx's data `dir`")
	remote := func() *client.Client {
		if f := fs.Lookup("server"); f == nil || f.Value.String() == "" {
			return nil
		}
		return connect()
	}
	return fs, dir, remote
}

// parseTemplateArgs parses flags that may come after positional arguments
// too (`build NAME --file x`), which flag.Parse alone does not allow.
func parseTemplateArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

func templateBuild(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, dir, remote := templateFlags("build", stderr)
	file := fs.String("file", "", "read the template spec from `spec.json`")
	pos, err := parseTemplateArgs(fs, args)
	if err != nil {
		return 2
	}
	if len(pos) > 1 {
		fmt.Fprintf(stderr, "sbx template build: one NAME, not %q\n", pos)
		return 2
	}
	name := ""
	if len(pos) == 1 {
		name = pos[0]
	}
	spec, err := buildSpec(name, *file)
	if err != nil {
		fmt.Fprintln(stderr, "sbx template build:", err)
		return 2
	}
	if c := remote(); c != nil {
		return remoteBuild(ctx, c, spec, stdout, stderr)
	}
	store := template.NewStore(filepath.Join(*dir, "templates"))
	store.Jobs = oci.NewJobRunner(oci.Config{StateDir: stateDir()})
	t, err := store.Ensure(ctx, spec, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "sbx template build:", err)
		if errors.Is(err, errdefs.ErrInvalidArgument) || errors.Is(err, errdefs.ErrAlreadyExists) {
			return 2
		}
		return 1
	}
	fmt.Fprintf(stdout, "%s %s %s %s\n", spec.Name, template.ShortHash(t.Hash), templateSize(t.SizeBytes), t.Rootfs)
	return 0
}

// buildSpec is the spec `build` means: the file's (named NAME if the file
// names none), else the built-in called NAME.
func buildSpec(name, file string) (template.Spec, error) {
	if file == "" {
		if name == "" {
			return template.Spec{}, errors.New("give a NAME (a built-in, or with --file)")
		}
		spec, ok := template.Builtin(name)
		if !ok {
			return template.Spec{}, fmt.Errorf("%q is not a built-in template; give its spec with --file", name)
		}
		return spec, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return template.Spec{}, err
	}
	var spec template.Spec
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields() // a misspelt field must not be silently ignored
	if err := dec.Decode(&spec); err != nil {
		return template.Spec{}, fmt.Errorf("%s: %w", file, err)
	}
	switch {
	case spec.Name == "":
		spec.Name = name
	case name != "" && name != spec.Name:
		return template.Spec{}, fmt.Errorf("NAME %q and the file's name %q differ", name, spec.Name)
	}
	return spec, spec.Validate()
}

func templateList(args []string, stdout, stderr io.Writer) int {
	fs, dir, remote := templateFlags("ls", stderr)
	pos, err := parseTemplateArgs(fs, args)
	if err != nil {
		return 2
	}
	if len(pos) > 0 {
		fmt.Fprintf(stderr, "sbx template ls: unexpected argument %q\n", pos[0])
		return 2
	}
	if c := remote(); c != nil {
		return remoteList(c, stdout, stderr)
	}
	store := template.NewStore(filepath.Join(*dir, "templates"))
	builds, err := store.List()
	if err != nil {
		fmt.Fprintln(stderr, "sbx template ls:", err)
		return 1
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tHASH\tSIZE\tBUILT\tRUNTIME")
	for _, b := range template.Builtins() {
		if _, ok := store.Lookup(b); !ok {
			fmt.Fprintf(tw, "%s\t-\t-\tnot built\t%s\n", b.Name, templateRuntime(b.Runtime))
		}
	}
	for _, t := range builds {
		names := t.Names
		if len(names) == 0 {
			names = []string{"(" + t.Spec.Name + ")"} // its name now points elsewhere
		}
		for _, n := range names {
			rt := t.Spec.Runtime
			if spec, err := store.Named(n); err == nil {
				rt = spec.Runtime
				if b, ok := template.Builtin(n); ok && b.Hash() != t.Hash {
					n += " (old)" // built by an earlier sbx; the current one differs
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", n, template.ShortHash(t.Hash), templateSize(t.SizeBytes),
				t.BuiltAt.Local().Format(time.DateTime), templateRuntime(rt))
		}
	}
	tw.Flush()
	return 0
}

func templateRemove(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, dir, remote := templateFlags("rm", stderr)
	force := fs.Bool("force", false, "delete even though sessions use it")
	pos, err := parseTemplateArgs(fs, args)
	if err != nil {
		return 2
	}
	if len(pos) != 1 {
		fmt.Fprintln(stderr, "sbx template rm: give one NAME or HASH")
		return 2
	}
	if c := remote(); c != nil {
		if err := c.DeleteTemplate(ctx, pos[0], *force); err != nil {
			return failed(stderr, "template rm", err)
		}
		fmt.Fprintf(stdout, "removed %s\n", pos[0])
		return 0
	}
	store := template.NewStore(filepath.Join(*dir, "templates"))
	hash, err := resolveBuild(store, pos[0])
	if err == nil {
		err = store.Remove(ctx, hash)
	}
	if err != nil {
		fmt.Fprintln(stderr, "sbx template rm:", err)
		return 1
	}
	fmt.Fprintf(stdout, "removed %s (%s)\n", pos[0], template.ShortHash(hash))
	return 0
}

// resolveBuild finds the build a NAME or HASH (prefix) on the command line
// means: a name first, since names cannot be told from short hashes.
func resolveBuild(store *template.Store, arg string) (string, error) {
	builds, err := store.List()
	if err != nil {
		return "", err
	}
	for _, t := range builds {
		for _, n := range t.Names {
			if n == arg {
				return t.Hash, nil
			}
		}
	}
	if b, ok := template.Builtin(arg); ok {
		if t, ok := store.Lookup(b); ok {
			return t.Hash, nil
		}
		return "", fmt.Errorf("template %q is not built: %w", arg, errdefs.ErrNotFound)
	}
	if t, err := store.Get(arg); err == nil {
		return t.Hash, nil
	}
	return "", fmt.Errorf("no template named %q and no build with that hash: %w", arg, errdefs.ErrNotFound)
}

func templateRuntime(rt string) string {
	if rt == "" {
		return "runc"
	}
	return rt
}

func templateSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%d MB", n>>20)
	default:
		return fmt.Sprintf("%d KB", n>>10)
	}
}

// remoteBuild posts spec to the server and shows its build's log as it
// runs; interrupting the command cancels the build.
func remoteBuild(ctx context.Context, c *client.Client, spec template.Spec, stdout, stderr io.Writer) int {
	t, queued, err := c.CreateTemplate(ctx, spec)
	if err != nil {
		return failed(stderr, "template build", err)
	}
	if queued {
		id := t.Build.BuildID
		fmt.Fprintf(stderr, "template %s: build %s queued\n", t.Name, id)
		t, err = c.FollowTemplateBuild(ctx, t.Name, id, func(line string) { fmt.Fprint(stderr, line) })
		if err != nil {
			if ctx.Err() != nil {
				// Interrupted: the build is not wanted any more.
				cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				c.CancelTemplateBuild(cctx, spec.Name, id)
			}
			return failed(stderr, "template build", err)
		}
	}
	if t.Status != api.TemplateReady {
		fmt.Fprintf(stderr, "sbx template build: %s: %s: %s\n", t.Name, t.Status, t.LastError)
		return 1
	}
	fmt.Fprintf(stdout, "%s %s %s %s\n", t.Name, template.ShortHash(t.Hash), templateSize(t.SizeBytes), t.Status)
	return 0
}

// remoteList lists the templates the caller can use on the server.
func remoteList(c *client.Client, stdout, stderr io.Writer) int {
	list, err := c.Templates(context.Background())
	if err != nil {
		return failed(stderr, "template ls", err)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSOURCE\tSTATUS\tHASH\tSIZE\tRUNTIME")
	for _, t := range list.Templates {
		size := "-"
		if t.SizeBytes > 0 {
			size = templateSize(t.SizeBytes)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", t.Name, t.Source, t.Status, template.ShortHash(t.Hash), size, t.Runtime)
	}
	tw.Flush()
	return 0
}
