//go:build integration

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/quota"
	"github.com/sbx-sandbox/sbx/internal/quota/quotatest"
	"github.com/sbx-sandbox/sbx/internal/runtime/oci"
	"github.com/sbx-sandbox/sbx/internal/testenv"
)

// `sbx serve` on its default limits, with real runc sandboxes, bounds a
// tenant by what the machine has (app.DefaultLimits): its live sandboxes'
// CPU at four times the cores, their memory at three quarters of the
// machine's, its sessions' disk at the workspace file system's size (here
// a 4 GiB image), each past it a 429 naming the limit; a session asking
// for more disk than the file system has is 400. Before, a default server
// bounded none of these, and one session could ask for a TiB of disk.
func TestServeDefaultLimits(t *testing.T) {
	env := testenv.New(t)
	env.Rootfs(t, "python")
	quotatest.Require(t)
	bin, _ := sbxBin(t)
	data := t.TempDir()
	state := filepath.Join(env.StateRoot, "defaults")
	rt, err := oci.New(oci.Config{StateDir: state, ExecutorPath: env.Executor})
	if err != nil {
		t.Fatal(err)
	}
	// Registered first, so they run last: the server has stopped, its
	// sandboxes go, then the image it left mounted.
	t.Cleanup(func() {
		if err := quota.Unmount(filepath.Join(data, "workspaces")); err != nil {
			t.Error(err)
		}
	})
	t.Cleanup(func() {
		infos, _ := rt.List(context.Background())
		for _, info := range infos {
			rt.Destroy(context.Background(), info.ID)
		}
	})
	cmd := exec.Command(bin, "serve", "--addr", "127.0.0.1:0", "--data-dir", data, "--state-dir", state,
		"--template-dir", testenv.TemplateDir(), "--prebuild", "", "--workspace-image-size", "4")
	cmd.Env = os.Environ()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var l struct{ Msg, URL string }
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == "serving" {
				urls <- l.URL
			}
			if testing.Verbose() {
				t.Log(sc.Text())
			}
		}
		close(urls)
	}()
	url, ok := <-urls
	if !ok {
		t.Fatal("sbx serve exited before it served")
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(filepath.Join(data, "workspaces"), &fs); err != nil {
		t.Fatal(err)
	}
	fsMB := int64(fs.Blocks) * fs.Bsize >> 20
	if fsMB < 3<<10 || fsMB > 4<<10 {
		t.Fatalf("the workspace file system of a 4 GiB image: %d MiB", fsMB)
	}
	c := client.New(url)
	ctx := context.Background()
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		t.Fatal(err)
	}
	memoryMB := int64(si.Totalram) * int64(si.Unit) >> 20
	create := func(id string, r api.Resources) error {
		_, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: id, TemplateID: "python", Resources: &r})
		return err
	}
	refused := func(what string, err error, status int, says string) {
		t.Helper()
		var ae *client.APIError
		if !errors.As(err, &ae) || ae.StatusCode != status || !strings.Contains(ae.Message, says) {
			t.Errorf("%s: %v, want %d saying %q", what, err, status, says)
		}
	}
	run := func(id string) (*api.Execution, error) {
		return c.Execute(ctx, id, api.ExecuteRequest{Code: "print('hi')"})
	}
	// refusedRun is one execute, not retried as the client retries a 429.
	refusedRun := func(what, id, says string) {
		t.Helper()
		resp, err := http.Post(url+"/api/v1/sessions/"+id+"/execute?wait=true", "application/json", strings.NewReader(`{"code":"print('hi')"}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(b), says) {
			t.Errorf("%s: %d %s, want 429 saying %q", what, resp.StatusCode, b, says)
		}
	}

	// Disk: one session may not pass the file system; the tenant's
	// sessions together may not either.
	refused("a session's disk past the file system", create("huge", api.Resources{Disk: fsMB + 1}), 400, "resources.disk")
	half := fsMB/2 + 1
	if err := create("d1", api.Resources{Disk: half}); err != nil {
		t.Fatal(err)
	}
	refused("the disk sum past the file system", create("d2", api.Resources{Disk: half}), 429, "disk (MiB, the sum of its sessions' resources.disk)")
	if _, err := c.DeleteSession(ctx, "d1"); err != nil {
		t.Fatal(err)
	}

	// Memory: a sandbox holding more than three quarters of the machine.
	if err := create("mem", api.Resources{Memory: memoryMB * 4 / 5, Disk: 16}); err != nil {
		t.Fatal(err)
	}
	refusedRun("a sandbox past three quarters of the memory", "mem", "sandbox memory (MiB)")

	// CPU: sandboxes of all the cores each, four of them; the fifth waits.
	// (Small disks: four of the default GiB fill a 4 GiB file system.)
	cores := float64(goruntime.NumCPU())
	for i := range 4 {
		id := fmt.Sprintf("cpu%d", i)
		if err := create(id, api.Resources{CPU: cores, Disk: 16}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.DeleteSession(context.Background(), id) })
		if res, err := run(id); err != nil || res.Status != api.ExecCompleted {
			t.Fatalf("sandbox %d of %v cores: %+v %v", i, cores, res, err)
		}
	}
	if err := create("cpu4", api.Resources{CPU: cores, Disk: 16}); err != nil {
		t.Fatal(err)
	}
	refusedRun("a fifth sandbox of all the cores", "cpu4", fmt.Sprintf("sandbox CPU (cores): %v in use, %v more asked, the limit is %v", 4*cores, cores, 4*cores))
}
