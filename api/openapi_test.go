package api_test

import (
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/sbx-sandbox/sbx/api"
)

// schemaOf maps each wire type of types.go to its schema in openapi.yaml.
// TestEveryTypeHasASchema makes sure a new type is not forgotten here.
var schemaOf = map[reflect.Type]string{
	reflect.TypeFor[api.Error]():                 "Error",
	reflect.TypeFor[api.ErrorBody]():             "ErrorBody",
	reflect.TypeFor[api.Resources]():             "Resources",
	reflect.TypeFor[api.FileUploadConfig]():      "FileUploadConfig",
	reflect.TypeFor[api.CreateSessionRequest]():  "CreateSessionRequest",
	reflect.TypeFor[api.Session]():               "Session",
	reflect.TypeFor[api.SessionList]():           "SessionList",
	reflect.TypeFor[api.Snapshot]():              "Snapshot",
	reflect.TypeFor[api.SnapshotList]():          "SnapshotList",
	reflect.TypeFor[api.SessionMetrics]():        "SessionMetrics",
	reflect.TypeFor[api.MetricsSample]():         "MetricsSample",
	reflect.TypeFor[api.DeleteSessionResponse](): "DeleteSessionResponse",
	reflect.TypeFor[api.KeepaliveRequest]():      "KeepaliveRequest",
	reflect.TypeFor[api.ExecuteRequest]():        "ExecuteRequest",
	reflect.TypeFor[api.AgentExecuteRequest]():   "AgentExecuteRequest",
	reflect.TypeFor[api.Tool]():                  "Tool",
	reflect.TypeFor[api.ToolFunction]():          "ToolFunction",
	reflect.TypeFor[api.ToolList]():              "ToolList",
	reflect.TypeFor[api.ToolInvokeRequest]():     "ToolInvokeRequest",
	reflect.TypeFor[api.ToolResult]():            "ToolResult",
	reflect.TypeFor[api.ChatRequest]():           "ChatRequest",
	reflect.TypeFor[api.ChatDelta]():             "ChatDelta",
	reflect.TypeFor[api.ChatToolCall]():          "ChatToolCall",
	reflect.TypeFor[api.ChatToolResult]():        "ChatToolResult",
	reflect.TypeFor[api.ChatMessage]():           "ChatMessage",
	reflect.TypeFor[api.ChatError]():             "ChatError",
	reflect.TypeFor[api.ChatDone]():              "ChatDone",
	reflect.TypeFor[api.ChatUsage]():             "ChatUsage",
	reflect.TypeFor[api.SubmitResponse]():        "SubmitResponse",
	reflect.TypeFor[api.ExecError]():             "ExecError",
	reflect.TypeFor[api.Execution]():             "Execution",
	reflect.TypeFor[api.ExecutionList]():         "ExecutionList",
	reflect.TypeFor[api.StreamOutput]():          "StreamOutput",
	reflect.TypeFor[api.UploadedFile]():          "UploadedFile",
	reflect.TypeFor[api.UploadResponse]():        "UploadResponse",
	reflect.TypeFor[api.FileEntry]():             "FileEntry",
	reflect.TypeFor[api.FileList]():              "FileList",
	reflect.TypeFor[api.PresignResponse]():       "PresignResponse",
	reflect.TypeFor[api.Health]():                "Health",
	reflect.TypeFor[api.NamedResource]():         "NamedResource",
	reflect.TypeFor[api.ResourceManifest]():      "ResourceManifest",
	reflect.TypeFor[api.ResourceSync]():          "ResourceSync",
	reflect.TypeFor[api.ResourceList]():          "ResourceList",
	reflect.TypeFor[api.ContentUpload]():         "ContentUpload",
	reflect.TypeFor[api.Template]():              "Template",
	reflect.TypeFor[api.TemplateBuild]():         "TemplateBuild",
	reflect.TypeFor[api.TemplateVersion]():       "TemplateVersion",
	reflect.TypeFor[api.TemplateList]():          "TemplateList",
	reflect.TypeFor[api.Event]():                 "Event",
	reflect.TypeFor[api.EventData]():             "EventData",
	reflect.TypeFor[api.EventList]():             "EventList",
	reflect.TypeFor[api.WebhookRequest]():        "WebhookRequest",
	reflect.TypeFor[api.Webhook]():               "Webhook",
	reflect.TypeFor[api.WebhookList]():           "WebhookList",
	reflect.TypeFor[api.WebhookDelivery]():       "WebhookDelivery",
	reflect.TypeFor[api.WebhookDeliveryList]():   "WebhookDeliveryList",
}

func loadDoc(t *testing.T) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI)
	if err != nil {
		t.Fatalf("loading openapi.yaml: %v", err)
	}
	return doc
}

func TestOpenAPIValid(t *testing.T) {
	doc := loadDoc(t)
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("openapi.yaml is not a valid OpenAPI document: %v", err)
	}
	if doc.OpenAPI != "3.0.3" {
		t.Errorf("openapi: %q, want 3.0.3", doc.OpenAPI)
	}
	// Every operation has an id (the client and the logs name operations
	// by it), and every one under the prefix says what its errors are.
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if op.OperationID == "" {
				t.Errorf("%s %s has no operationId", method, path)
			}
			if strings.HasPrefix(path, api.Prefix+"/") && op.Responses.Status(500) == nil {
				t.Errorf("%s %s does not declare 500", method, path)
			}
		}
	}
}

// TestTypesMatchSchemas: every JSON field of every wire type is a property
// of its schema with a fitting type, and the other way round; a field
// that is always sent (no omitempty) is required, and one that may be
// left out is not.
func TestTypesMatchSchemas(t *testing.T) {
	doc := loadDoc(t)
	for typ, name := range schemaOf {
		t.Run(name, func(t *testing.T) {
			ref := doc.Components.Schemas[name]
			if ref == nil || ref.Value == nil {
				t.Fatalf("no schema %s in openapi.yaml for %s", name, typ)
			}
			s := ref.Value
			if !s.Type.Is("object") {
				t.Errorf("schema %s is not an object", name)
			}
			if s.AdditionalProperties.Has == nil || *s.AdditionalProperties.Has {
				t.Errorf("schema %s: want additionalProperties: false, so that undocumented fields fail validation", name)
			}
			fields := jsonFields(typ)
			for _, f := range fields {
				prop := s.Properties[f.name]
				if prop == nil {
					t.Errorf("%s.%s (json %q) is not a property of schema %s", typ.Name(), f.goName, f.name, name)
					continue
				}
				checkField(t, name, f, prop)
				if required := slices.Contains(s.Required, f.name); required == f.omitempty {
					if f.omitempty {
						t.Errorf("%s.%s is omitempty but required in schema %s", typ.Name(), f.goName, name)
					} else {
						t.Errorf("%s.%s is always sent but not required in schema %s", typ.Name(), f.goName, name)
					}
				}
			}
			for prop := range s.Properties {
				if !slices.ContainsFunc(fields, func(f field) bool { return f.name == prop }) {
					t.Errorf("schema %s has property %q, which %s does not have", name, prop, typ)
				}
			}
			for _, req := range s.Required {
				if s.Properties[req] == nil {
					t.Errorf("schema %s requires %q, which is not one of its properties", name, req)
				}
			}
		})
	}
}

// TestEveryTypeHasASchema: each struct type declared in the package's
// files is in schemaOf, so the check above covers it.
func TestEveryTypeHasASchema(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	mapped := map[string]bool{}
	for typ := range schemaOf {
		mapped[typ.Name()] = true
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		checkDecls(t, f, mapped)
	}
}

func checkDecls(t *testing.T, f *ast.File, mapped map[string]bool) {
	t.Helper()
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.TYPE {
			continue
		}
		for _, spec := range gd.Specs {
			ts := spec.(*ast.TypeSpec)
			if _, ok := ts.Type.(*ast.StructType); ok && ts.Name.IsExported() && !mapped[ts.Name.Name] {
				t.Errorf("api.%s has no schema in schemaOf (api/openapi_test.go); add it there and to openapi.yaml", ts.Name.Name)
			}
		}
	}
}

type field struct {
	goName, name string
	omitempty    bool
	typ          reflect.Type
}

func jsonFields(typ reflect.Type) []field {
	var out []field
	for sf := range typ.Fields() {
		if !sf.IsExported() {
			continue
		}
		tag := sf.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "" {
			name = sf.Name
		}
		out = append(out, field{goName: sf.Name, name: name, omitempty: strings.Contains(","+opts+",", ",omitempty,"), typ: sf.Type})
	}
	return out
}

var (
	timeType = reflect.TypeFor[time.Time]()
	rawType  = reflect.TypeFor[json.RawMessage]()
)

// checkField compares a field's Go type with its property's schema.
func checkField(t *testing.T, schema string, f field, prop *openapi3.SchemaRef) {
	t.Helper()
	typ := f.typ
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	where := schema + "." + f.name
	ref, s := resolve(prop)
	switch {
	case typ == rawType:
		if !s.Type.IsEmpty() || !s.Nullable {
			t.Errorf("%s is any JSON (json.RawMessage): want a schema without a type and nullable: true", where)
		}
		return
	case typ == timeType:
		if !s.Type.Is("string") || s.Format != "date-time" {
			t.Errorf("%s is a time: want type string, format date-time", where)
		}
		return
	}
	want := ""
	switch typ.Kind() {
	case reflect.String:
		want = "string"
	case reflect.Bool:
		want = "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		want = "integer"
	case reflect.Float32, reflect.Float64:
		want = "number"
	case reflect.Slice, reflect.Array:
		want = "array"
	case reflect.Map, reflect.Struct:
		want = "object"
	}
	if !s.Type.Is(want) {
		t.Errorf("%s: schema type %v, want %s (Go %s)", where, s.Type.Slice(), want, f.typ)
		return
	}
	// A field of a wire type refers to that type's schema.
	elem := typ
	if typ.Kind() == reflect.Slice {
		elem = typ.Elem()
		if s.Items == nil {
			t.Errorf("%s: array without items", where)
			return
		}
		ref, _ = resolve(s.Items)
	}
	if name, ok := schemaOf[elem]; ok && ref != "#/components/schemas/"+name {
		t.Errorf("%s: refers to %q, want #/components/schemas/%s (Go %s)", where, ref, name, f.typ)
	}
}

// resolve follows a lone allOf (used to give a referenced schema a
// description of its own) to the schema it means.
func resolve(r *openapi3.SchemaRef) (string, *openapi3.Schema) {
	if r.Ref == "" && len(r.Value.AllOf) == 1 && r.Value.Type.IsEmpty() {
		return r.Value.AllOf[0].Ref, r.Value.AllOf[0].Value
	}
	return r.Ref, r.Value
}
