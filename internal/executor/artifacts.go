package executor

import (
	"errors"
	"io/fs"
	"maps"
	"path/filepath"
	"sort"
	"syscall"

	"github.com/sbx-sandbox/sbx/internal/executor/wire"
)

// maxWalkEntries bounds one walk of the workspace. A run's latency must not
// grow without bound with the number of files the session has collected;
// past this, artifacts are not reported (artifacts_truncated says so).
const maxWalkEntries = 20_000

// fileKey is what tells that a file changed. Size and mtime alone miss a
// file replaced by another of the same size within one timestamp tick;
// the inode catches the usual write-to-temp-then-rename.
type fileKey struct {
	size  int64
	mtime int64 // ns
	ino   uint64
}

// workspaceSnapshot is the state of the regular files under a directory.
type workspaceSnapshot struct {
	files map[string]fileKey
	// modes is every entry's type and permissions (directories and links
	// too, which files leaves out): with files, what tells whether a run
	// changed the workspace at all (unchanged).
	modes map[string]fs.FileMode
	// truncated is set when the walk gave up at maxWalkEntries.
	truncated bool
	// blind is set when part of the tree could not be read.
	blind bool
	// bytes is the disk the regular files take (their allocated blocks):
	// at least that, if truncated or blind.
	bytes int64
}

// snapshotWorkspace walks root without following symbolic links: a link
// planted by user code must not make the executor (root) stat or report
// anything outside the workspace.
func snapshotWorkspace(root string) workspaceSnapshot {
	snap := workspaceSnapshot{files: make(map[string]fileKey), modes: make(map[string]fs.FileMode)}
	entries := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			// What cannot be read (a directory user code made 000,
			// the root if the walk lacks the right) is not known:
			// unchanged cannot be said of it.
			snap.blind = true
			if d != nil && d.IsDir() && p != root {
				return filepath.SkipDir // unreadable directory: skip it
			}
			return nil
		}
		entries++
		if entries > maxWalkEntries {
			snap.truncated = true
			return filepath.SkipAll
		}
		info, err := d.Info() // lstat
		if err != nil {
			return nil // removed meanwhile
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return nil
		}
		rel = filepath.ToSlash(rel)
		snap.modes[rel] = info.Mode()
		if !d.Type().IsRegular() {
			return nil // directories are walked; links, fifos, sockets are not files
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		snap.files[rel] = fileKey{size: st.Size, mtime: st.Mtim.Nano(), ino: st.Ino}
		snap.bytes += st.Blocks * 512
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		snap.truncated = true
	}
	return snap
}

// artifacts lists the files new or changed between two snapshots, sorted,
// at most MaxArtifacts of them. If either walk gave up, the comparison
// would report files that were merely not seen before, so nothing is
// reported and truncated is set.
func artifacts(before, after workspaceSnapshot) (paths []string, truncated bool) {
	if before.truncated || after.truncated {
		return []string{}, true
	}
	paths = []string{}
	for p, k := range after.files {
		if old, ok := before.files[p]; !ok || old != k {
			paths = append(paths, p)
		}
	}
	sort.Strings(paths)
	if len(paths) > wire.MaxArtifacts {
		return paths[:wire.MaxArtifacts], true
	}
	return paths, false
}

// unchanged reports whether nothing changed between two snapshots that
// both saw the whole workspace: no file, directory or link made, removed
// or renamed, no file written, no mode changed. A link retargeted in place
// within one timestamp tick is the one change it cannot see.
func unchanged(before, after workspaceSnapshot) bool {
	return !before.truncated && !after.truncated && !before.blind && !after.blind &&
		maps.Equal(before.files, after.files) && maps.Equal(before.modes, after.modes)
}
