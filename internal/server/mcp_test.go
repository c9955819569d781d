package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sbx-sandbox/sbx/api"
)

// mcpConnect connects the Go SDK's client to /mcp with query q, sending
// key as a bearer token.
func mcpConnect(t *testing.T, ts *testServer, q, key string) (*sdk.ClientSession, error) {
	t.Helper()
	hc := &http.Client{}
	if key != "" {
		hc.Transport = bearer{key}
	}
	c := sdk.NewClient(&sdk.Implementation{Name: "sbx-test", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &sdk.StreamableClientTransport{Endpoint: ts.URL + "/mcp?" + q, HTTPClient: hc}, nil)
	if err == nil {
		t.Cleanup(func() { cs.Close() })
	}
	return cs, err
}

type bearer struct{ key string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return http.DefaultTransport.RoundTrip(r)
}

func callText(t *testing.T, cs *sdk.ClientSession, name string, args map[string]any) (*sdk.CallToolResult, string) {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var text strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			text.WriteString(tc.Text)
		}
	}
	return res, text.String()
}

// TestMCP: the tools over MCP, with the official Go SDK as the client
// (the Node SDK runs against a real server in TestMCPNode).
func TestMCP(t *testing.T) {
	ts := start(t, "mcp-key-123:alpha")
	cs, err := mcpConnect(t, ts, "user_id=u1&agent_id=a1", "mcp-key-123")
	if err != nil {
		t.Fatal(err)
	}
	list, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, b := ts.do(t, "GET", "/api/v1/tools", "", nil, "Authorization", "Bearer mcp-key-123")
	var want api.ToolList
	json.Unmarshal(b, &want)
	if len(list.Tools) != len(want.Tools) {
		t.Fatalf("MCP has %d tools, the API %d", len(list.Tools), len(want.Tools))
	}
	byName := map[string]api.ToolFunction{}
	for _, tool := range want.Tools {
		byName[tool.Function.Name] = tool.Function
	}
	for _, tool := range list.Tools {
		w := byName[tool.Name]
		got, _ := json.Marshal(tool.InputSchema)
		var g, ws any
		json.Unmarshal(got, &g)
		json.Unmarshal(w.Parameters, &ws)
		gb, _ := json.Marshal(g)
		wb, _ := json.Marshal(ws)
		if tool.Name != w.Name || tool.Description != w.Description || string(gb) != string(wb) {
			t.Errorf("MCP tool %s %s, want %s %s", tool.Name, gb, w.Name, wb)
		}
	}

	if res, text := callText(t, cs, "upload_file", map[string]any{"path": "notes/a.txt", "content": "hello mcp"}); res.IsError || !strings.Contains(text, "wrote 9 bytes") {
		t.Errorf("upload_file: %v %q", res.IsError, text)
	}
	res, text := callText(t, cs, "read_file", map[string]any{"path": "notes/a.txt", "offset": 6, "length": 3})
	if res.IsError || !strings.HasSuffix(text, ":\nmcp") {
		t.Errorf("read_file: %v %q", res.IsError, text)
	}
	var part struct {
		Content string `json:"content"`
		EOF     bool   `json:"eof"`
	}
	if sc, _ := json.Marshal(res.StructuredContent); json.Unmarshal(sc, &part) != nil || part.Content != "mcp" || !part.EOF {
		t.Errorf("read_file structured content %+v", res.StructuredContent)
	}
	// The same session as the tool endpoint's, in the key's tenant.
	resp, _ := ts.do(t, "GET", "/api/v1/sessions/sb-session-u1-a1/files/notes/a.txt", "", nil, "Authorization", "Bearer mcp-key-123")
	if resp.StatusCode != 200 {
		t.Errorf("the file is not in the agent's session: %d", resp.StatusCode)
	}
	// What the model can act on comes back as an error result.
	for name, args := range map[string]map[string]any{
		"read_file":    {"path": "missing.txt"},
		"list_files":   {"path": "x", "bogus": true},
		"execute_code": {"code": "1", "timeout": 1e9},
	} {
		if res, text := callText(t, cs, name, args); !res.IsError || !strings.HasPrefix(text, "error: ") {
			t.Errorf("%s %v: %v %q, want an error result", name, args, res.IsError, text)
		}
	}

	// Who may connect.
	if _, err := mcpConnect(t, ts, "user_id=u1&agent_id=a1", ""); err == nil {
		t.Error("connected without a key")
	}
	for _, q := range []string{"agent_id=a1", "user_id=../x&agent_id=a1", "user_id=u1&agent_id=a1&conversation_id=a/b"} {
		resp, b := ts.do(t, "POST", "/mcp?"+q, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`),
			"Authorization", "Bearer mcp-key-123", "Accept", "application/json, text/event-stream")
		if resp.StatusCode != 400 || !strings.Contains(string(b), "invalid_argument") {
			t.Errorf("/mcp?%s: %d %s, want 400", q, resp.StatusCode, b)
		}
	}
}
