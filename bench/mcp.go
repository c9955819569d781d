package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"path/filepath"
	"strings"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime"
)

// benchMCP measures a tool call over MCP (/mcp, stateless streamable
// HTTP, the Go SDK's client) against the same call on the tool endpoint,
// in the same process: read_file of 4 KiB, which needs no sandbox, so the
// difference is MCP's own cost (a server made per request, JSON-RPC, SSE).
func benchMCP(ctx context.Context, add func(row)) {
	noRuntime := func(string) (runtime.Runtime, error) {
		return nil, fmt.Errorf("mcp only: %w", errdefs.ErrUnavailable)
	}
	cp := startControlPlane(filepath.Join(*dataDir, "bench-mcp"), noRuntime)
	defer cp.stop()
	args := map[string]any{"path": "notes.txt", "content": strings.Repeat("x", 4096)}
	raw, _ := json.Marshal(args)
	who := api.ToolInvokeRequest{UserID: "bench", AgentID: "mcp"}
	req := who
	req.Arguments = raw
	if _, err := cp.c.InvokeTool(ctx, "upload_file", req); err != nil {
		log.Fatal(err)
	}
	req.Arguments = json.RawMessage(`{"path":"notes.txt"}`)
	invoke := measure(300, func() {
		if r, err := cp.c.InvokeTool(ctx, "read_file", req); err != nil || r.IsError {
			log.Fatalf("read_file: %v %+v", err, r)
		}
	})

	connect := func() *sdk.ClientSession {
		c := sdk.NewClient(&sdk.Implementation{Name: "bench", Version: "1"}, nil)
		cs, err := c.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: cp.url + "/mcp?user_id=bench&agent_id=mcp"}, nil)
		if err != nil {
			log.Fatal(err)
		}
		return cs
	}
	connects := measure(50, func() { connect().Close() })
	cs := connect()
	defer cs.Close()
	call := measure(300, func() {
		r, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "read_file", Arguments: map[string]any{"path": "notes.txt"}})
		if err != nil || r.IsError {
			log.Fatalf("MCP read_file: %v %+v", err, r)
		}
	})
	list := measure(300, func() {
		if _, err := cs.ListTools(ctx, nil); err != nil {
			log.Fatal(err)
		}
	})
	add(row{name: "(j) read_file 4 KiB, POST /tools/read_file/invoke", p50: invoke.p(50), p99: invoke.p(99)})
	add(row{name: "    the same over MCP (/mcp, tools/call)", p50: call.p(50), p99: call.p(99),
		vs: ratio(call.p(50), invoke.p(50), "tool endpoint")})
	add(row{name: "    MCP tools/list", p50: list.p(50), p99: list.p(99)})
	add(row{name: "    MCP connect (initialize + initialized)", p50: connects.p(50), p99: connects.p(99)})
}
