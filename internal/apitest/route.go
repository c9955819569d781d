package apitest

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/routers"

	"github.com/sbx-sandbox/sbx/api"
)

// contract is api/openapi.yaml, loaded and indexed for routing.
type contract struct {
	doc    *openapi3.T
	routes []*route
}

// route is one operation and the path template it lives at.
type route struct {
	*routers.Route
	// segments of the template: literals, or "{name}" for a parameter.
	segments []string
	// rest names the template's last parameter when it takes the rest of
	// the URL, slashes and all (x-rest-of-path: true in the document).
	rest     string
	literals int
}

// load reads the contract once per test binary.
var load = sync.OnceValues(func() (*contract, error) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(api.OpenAPI)
	if err != nil {
		return nil, fmt.Errorf("loading api/openapi.yaml: %w", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		return nil, fmt.Errorf("api/openapi.yaml is not valid: %w", err)
	}
	c := &contract{doc: doc}
	for _, path := range doc.Paths.InMatchingOrder() {
		item := doc.Paths.Value(path)
		for method, op := range item.Operations() {
			r := &route{
				Route:    &routers.Route{Spec: doc, Path: path, PathItem: item, Method: method, Operation: op},
				segments: strings.Split(strings.TrimPrefix(path, "/"), "/"),
			}
			for _, s := range r.segments {
				if !isParam(s) {
					r.literals++
				}
			}
			if last := r.segments[len(r.segments)-1]; isParam(last) {
				name := strings.Trim(last, "{}")
				if p := findParam(item, op, name); p != nil && p.Extensions["x-rest-of-path"] == true {
					r.rest = name
				}
			}
			c.routes = append(c.routes, r)
		}
	}
	return c, nil
})

func isParam(seg string) bool { return strings.HasPrefix(seg, "{") && strings.HasSuffix(seg, "}") }

func findParam(item *openapi3.PathItem, op *openapi3.Operation, name string) *openapi3.Parameter {
	if p := op.Parameters.GetByInAndName(openapi3.ParameterInPath, name); p != nil {
		return p
	}
	return item.Parameters.GetByInAndName(openapi3.ParameterInPath, name)
}

// find is the operation a request is for, and its path parameters. Like
// http.ServeMux, it matches the escaped path a segment at a time and
// prefers the template with the most literal segments
// (/files/upload over /files/{path}).
func (c *contract) find(r *http.Request) (*route, map[string]string, error) {
	method := r.Method
	if method == http.MethodHead {
		method = http.MethodGet
	}
	segs := strings.Split(strings.TrimPrefix(r.URL.EscapedPath(), "/"), "/")
	var (
		best       *route
		bestParams map[string]string
		methods    []string
	)
	for _, rt := range c.routes {
		params, ok := rt.match(segs)
		if !ok {
			continue
		}
		if rt.Method != method {
			methods = append(methods, rt.Method)
			continue
		}
		if best == nil || rt.literals > best.literals {
			best, bestParams = rt, params
		}
	}
	switch {
	case best != nil:
		return best, bestParams, nil
	case len(methods) > 0:
		slices.Sort(methods)
		return nil, nil, fmt.Errorf("the contract has no %s for this path (only %s)", r.Method, strings.Join(slices.Compact(methods), ", "))
	default:
		return nil, nil, fmt.Errorf("the path is not in the contract")
	}
}

func (rt *route) match(segs []string) (map[string]string, bool) {
	if len(segs) < len(rt.segments) || (len(segs) > len(rt.segments) && rt.rest == "") {
		return nil, false
	}
	params := map[string]string{}
	for i, tmpl := range rt.segments {
		if !isParam(tmpl) {
			if segs[i] != tmpl {
				return nil, false
			}
			continue
		}
		name := strings.Trim(tmpl, "{}")
		raw := segs[i]
		if name == rt.rest {
			raw = strings.Join(segs[i:], "/")
		}
		v, err := unescapeSegments(raw)
		if err != nil || v == "" {
			return nil, false
		}
		params[name] = v
	}
	return params, true
}

// unescapeSegments unescapes each slash-separated segment of p, so that an
// escaped slash (%2F) inside a segment stays part of that segment's value.
func unescapeSegments(p string) (string, error) {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		u, err := url.PathUnescape(s)
		if err != nil {
			return "", err
		}
		segs[i] = u
	}
	return strings.Join(segs, "/"), nil
}
