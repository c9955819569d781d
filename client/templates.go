package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"

	"github.com/sbx-sandbox/sbx/api"
)

func templatePath(name, rest string) (string, error) {
	seg, err := segment("template name", name)
	if err != nil {
		return "", err
	}
	return api.Prefix + "/templates/" + seg + rest, nil
}

// Templates lists the templates a session can use: the built-ins, the
// server operator's and the caller's own.
func (c *Client) Templates(ctx context.Context) (*api.TemplateList, error) {
	var out api.TemplateList
	if _, err := c.call(ctx, http.MethodGet, api.Prefix+"/templates", nil, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return &out, nil
}

// Template returns one template, with its latest build and versions when
// it is the caller's.
func (c *Client) Template(ctx context.Context, name string) (*api.Template, error) {
	p, err := templatePath(name, "")
	if err != nil {
		return nil, err
	}
	var out api.Template
	if _, err := c.call(ctx, http.MethodGet, p, nil, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return &out, nil
}

// CreateTemplate defines one of the caller's templates by spec (the JSON
// of `sbx template build --file`: a struct or a json.RawMessage) and
// builds it in the background. queued says whether a build started;
// otherwise the spec was built already and the template is ready.
func (c *Client) CreateTemplate(ctx context.Context, spec any) (t *api.Template, queued bool, err error) {
	t = new(api.Template)
	status, err := c.call(ctx, http.MethodPost, api.Prefix+"/templates", nil, spec, t, http.StatusAccepted, http.StatusOK)
	if err != nil {
		return nil, false, err
	}
	return t, status == http.StatusAccepted, nil
}

// DeleteTemplate deletes one of the caller's templates; force deletes it
// even though sessions use it.
func (c *Client) DeleteTemplate(ctx context.Context, name string, force bool) error {
	p, err := templatePath(name, "")
	if err != nil {
		return err
	}
	q := url.Values{}
	if force {
		q.Set("force", "true")
	}
	_, err = c.call(ctx, http.MethodDelete, p, q, nil, nil, http.StatusNoContent)
	return err
}

// CancelTemplateBuild cancels a build that is queued or running.
func (c *Client) CancelTemplateBuild(ctx context.Context, name, buildID string) (*api.Template, error) {
	seg, err := segment("build id", buildID)
	if err != nil {
		return nil, err
	}
	p, err := templatePath(name, "/builds/"+seg+"/cancel")
	if err != nil {
		return nil, err
	}
	var out api.Template
	if _, err := c.call(ctx, http.MethodPost, p, nil, nil, &out, http.StatusAccepted); err != nil {
		return nil, err
	}
	return &out, nil
}

// FollowTemplateBuild streams a build's log to onLog, a line at a time,
// until the build ends, and returns the template as it ended.
func (c *Client) FollowTemplateBuild(ctx context.Context, name, buildID string, onLog func(line string)) (*api.Template, error) {
	seg, err := segment("build id", buildID)
	if err != nil {
		return nil, err
	}
	p, err := templatePath(name, "/builds/"+seg+"/logs")
	if err != nil {
		return nil, err
	}
	req, err := c.request(ctx, http.MethodGet, p, nil, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := c.do(req, http.StatusOK)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		return nil, fmt.Errorf("template %s: the server answered with %q, not an event stream", name, mt)
	}
	events := newSSEReader(resp.Body)
	for {
		ev, err := events.next()
		if err == io.EOF {
			return nil, fmt.Errorf("template %s: build %s: the stream ended before the build: %w", name, buildID, io.ErrUnexpectedEOF)
		}
		if err != nil {
			return nil, fmt.Errorf("template %s: build %s: reading the stream: %w", name, buildID, err)
		}
		switch ev.name {
		case "log":
			var out api.StreamOutput
			if err := json.Unmarshal([]byte(ev.data), &out); err != nil {
				return nil, fmt.Errorf("template %s: a log event: %w", name, err)
			}
			if onLog != nil {
				onLog(out.Text)
			}
		case "end":
			var t api.Template
			if err := json.Unmarshal([]byte(ev.data), &t); err != nil {
				return nil, fmt.Errorf("template %s: the end event: %w", name, err)
			}
			return &t, nil
		}
	}
}
