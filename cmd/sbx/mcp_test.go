package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// `sbx mcp` on pipes, the Go SDK's client on the other end, a real server
// (no sandboxes) behind it.
func TestMCPStdio(t *testing.T) {
	ts := startServer(t)

	var stderr bytes.Buffer
	if code := run(context.Background(), []string{"mcp", "--server", ts.URL, "--user", "u1"}, io.Discard, &stderr); code != 2 {
		t.Errorf("without --agent: exit %d, want 2", code)
	}

	toServer, clientOut := io.Pipe()
	clientIn, fromServer := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	go func() {
		done <- runMCP(ctx, []string{"--server", ts.URL, "--user", "u1", "--agent", "a1", "--conversation", "c1"}, toServer, fromServer, &stderr)
	}()
	c := sdk.NewClient(&sdk.Implementation{Name: "sbx-test", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &sdk.IOTransport{Reader: clientIn, Writer: clientOut}, nil)
	if err != nil {
		t.Fatal(err)
	}
	list, err := cs.ListTools(ctx, nil)
	if err != nil || len(list.Tools) != 5 {
		t.Fatalf("tools: %v %v", list, err)
	}
	call := func(name string, args map[string]any) (bool, string) {
		t.Helper()
		res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return res.IsError, res.Content[0].(*sdk.TextContent).Text
	}
	if isErr, text := call("upload_file", map[string]any{"path": "a.txt", "content": "from stdio"}); isErr {
		t.Errorf("upload_file: %s", text)
	}
	if isErr, text := call("read_file", map[string]any{"path": "a.txt"}); isErr || !strings.HasSuffix(text, "from stdio") {
		t.Errorf("read_file: %v %q", isErr, text)
	}
	if isErr, text := call("read_file", map[string]any{"path": "a.txt", "length": -1}); !isErr || !strings.Contains(text, "length") {
		t.Errorf("a bad length: %v %q", isErr, text)
	}
	// No sandbox runtime here: the failure reaches the model as a result.
	if isErr, text := call("execute_code", map[string]any{"code": "print(1)"}); !isErr || !strings.Contains(text, "unavailable") {
		t.Errorf("execute_code without a runtime: %v %q", isErr, text)
	}
	cs.Close()
	clientOut.Close()
	if code := <-done; code != 0 {
		t.Errorf("sbx mcp exit %d: %s", code, stderr.String())
	}
	cancel()
}
