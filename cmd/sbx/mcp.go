package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/internal/mcp"
)

const mcpUsage = `usage: sbx mcp --user USER --agent AGENT [--conversation CID] [flags]

Serves the tools of an sbx server (execute_code, run_bash, upload_file,
list_files, read_file) as an MCP server on standard input and output, for
MCP clients that start their servers as commands. Every call runs in the
session sb-session-USER-AGENT, made on first use. Clients that speak
streamable HTTP can use the server's /mcp?user_id=USER&agent_id=AGENT
instead, with no command in between.

flags:
  --user ID           the user whose sandbox the tools work in
  --agent ID          the agent
  --conversation CID  the conversation whose uploads code sees
` + clientFlagsUsage

// runMCP implements `sbx mcp`.
func runMCP(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs, connect := clientFlags("mcp", mcpUsage, stderr)
	var (
		user         = fs.String("user", "", "user `id`")
		agent        = fs.String("agent", "", "agent `id`")
		conversation = fs.String("conversation", "", "conversation `id`")
	)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *user == "" || *agent == "" || fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sbx mcp: give --user and --agent, and nothing else\n\n%s", mcpUsage)
		return 2
	}
	c := connect()
	// The tools are the server's: one request at start, and the server
	// checks every call as it does its own endpoint's.
	tools, err := c.Tools(ctx)
	if err != nil {
		return failed(stderr, "mcp", err)
	}
	base := api.ToolInvokeRequest{UserID: *user, AgentID: *agent, ConversationID: *conversation}
	srv := mcp.NewServer(tools, func(ctx context.Context, name string, args json.RawMessage) (*api.ToolResult, error) {
		req := base
		req.Arguments = args
		return c.InvokeTool(ctx, name, req)
	}, version)
	if err := mcp.Serve(ctx, srv, io.NopCloser(stdin), nopWriteCloser{stdout}); err != nil && ctx.Err() == nil {
		fmt.Fprintln(stderr, "sbx mcp:", err)
		return 1
	}
	return 0
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
