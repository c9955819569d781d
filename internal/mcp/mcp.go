// Package mcp serves sbx's tools over the Model Context Protocol,
// on the official Go SDK: the tools of GET /api/v1/tools, under the same
// names and schemas, run by whatever Invoke the caller gives. The server
// mounts it at /mcp (streamable HTTP); `sbx mcp` runs it on stdio in
// front of a remote server.
package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sbx-sandbox/sbx/api"
)

// Invoke runs one tool with the arguments a model gave, for the one user
// and agent the server was made for. An error is the call's failure; the
// model sees it as an error result.
type Invoke func(ctx context.Context, name string, arguments json.RawMessage) (*api.ToolResult, error)

// NewServer makes an MCP server with tools, each run by invoke.
func NewServer(tools []api.Tool, invoke Invoke, version string) *sdk.Server {
	s := sdk.NewServer(&sdk.Implementation{Name: "sbx", Title: "sbx sandbox", Version: version}, &sdk.ServerOptions{
		Instructions: "Tools that run code and keep files in the user's own Linux sandbox. " +
			"Files under /workspace persist between calls.",
	})
	for _, t := range tools {
		name := t.Function.Name
		s.AddTool(&sdk.Tool{
			Name:        name,
			Description: t.Function.Description,
			InputSchema: t.Function.Parameters,
			Annotations: &sdk.ToolAnnotations{ReadOnlyHint: name == "list_files" || name == "read_file"},
		}, func(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			res, err := invoke(ctx, name, req.Params.Arguments)
			if err != nil {
				if errors.Is(err, context.Canceled) {
					return nil, err
				}
				// The model should hear why, and may call again.
				return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: "error: " + err.Error()}}}, nil
			}
			out := &sdk.CallToolResult{IsError: res.IsError, Content: []sdk.Content{&sdk.TextContent{Text: res.Content}}}
			if len(res.Data) > 0 && res.Data[0] == '{' {
				out.StructuredContent = res.Data
			}
			return out, nil
		})
	}
	return s
}

// Handler serves s on MCP's streamable HTTP transport, stateless: every
// request stands alone, so any replica behind a load balancer can answer
// it and nothing is kept between requests.
func Handler(s *sdk.Server) http.Handler {
	return sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, &sdk.StreamableHTTPOptions{Stateless: true})
}

// Serve serves s on a stream of newline-delimited JSON-RPC messages (MCP's
// stdio transport: in is the client's stdout, out its stdin) until the
// client hangs up or ctx ends.
func Serve(ctx context.Context, s *sdk.Server, in io.ReadCloser, out io.WriteCloser) error {
	return s.Run(ctx, &sdk.IOTransport{Reader: in, Writer: out})
}
