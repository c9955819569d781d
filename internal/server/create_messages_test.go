package server_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/sbx-sandbox/sbx/api"
)

// TestCreateValidationMessages pins the whole message of every create
// error a REST client can get: the session domain has its own request
// type, and the REST edge's translation must say what it said before,
// in the wire's field names and units.
func TestCreateValidationMessages(t *testing.T) {
	ts := start(t)
	cases := []struct{ body, want string }{
		{`{"session_id":"../etc"}`, `session_id "../etc": want 1-128 characters of [A-Za-z0-9._-], starting with a letter or digit, without ".."`},
		{`{"template_id":"../x"}`, `template_id "../x" is not a template name ([a-z0-9-], at most 63 characters)`},
		{`{"timeout":-1}`, `timeout -1: the session's time to live is 1..604800 seconds (0 for the default, 86400)`},
		{`{"timeout":9223372036854775807}`, `timeout 9223372036854775807: the session's time to live is 1..604800 seconds (0 for the default, 86400)`},
		{`{"idle_timeout":604801}`, `idle_timeout 604801: want 1..604800 seconds (0 for the default, 600)`},
		{`{"hibernate_timeout":-9223372036854775808}`, `hibernate_timeout -9223372036854775808: want 1..604800 seconds (0 for the default, 86400)`},
		{`{"resources":{"cpu":1000}}`, `resources.cpu 1000: want 0.01..16 cores (this server's limit for one session)`},
		{`{"resources":{"cpu":0.001}}`, `resources.cpu 0.001: want 0.01..16 cores (this server's limit for one session)`},
		{`{"resources":{"memory":99999999}}`, `resources.memory 99999999: want 64..65536 MiB (this server's limit for one session)`},
		{`{"env_vars":{"A=B":"c"}}`, `env_vars: "A=B" is not a variable name ([A-Za-z_][A-Za-z0-9_]*)`},
		{`{"env_vars":{"A":"b\u0000"}}`, `env_vars: the value of A contains NUL`},
		{`{"network":"host"}`, `network "host": only "none" is supported (sandboxes have loopback only)`},
		{`{"metadata":{"a b":"c"}}`, `metadata: key "a b": want 1-64 characters of [A-Za-z0-9._-]`},
		{`{"metadata":{"a":"b\u0000"}}`, `metadata: the value of a must be at most 1024 bytes without NUL`},
		{`{"file_upload_config":{"max_file_size_unit":"TB"}}`, `file_upload_config.max_file_size_unit "TB": want KB, MB or GB`},
		{`{"file_upload_config":{"max_file_size":-1}}`, `file_upload_config.max_file_size -1 must not be negative`},
		{`{"file_upload_config":{"max_file_count":100001}}`, `file_upload_config.max_file_count 100001: want 1..100000 (0 for the default, 1000)`},
		{`{"file_upload_config":{"allowed_file_types":["../x"]}}`, `file_upload_config.allowed_file_types: "../x" is neither an extension (.csv) nor a media type (text/csv, image/*)`},
		{`{"file_upload_config":{"max_file_size":11,"max_file_size_unit":"GB"}}`, `file_upload_config.max_file_size 11 GB is more than 10 GB`},
	}
	for _, c := range cases {
		resp, b := ts.do(t, "POST", "/api/v1/sessions", "application/json", strings.NewReader(c.body))
		var e api.Error
		if err := json.Unmarshal(b, &e); err != nil || resp.StatusCode != 400 || e.Error.Code != "invalid_argument" || e.Error.Message != c.want+": invalid argument" {
			t.Errorf("%s: %d %s\nwant 400 saying %s", c.body, resp.StatusCode, b, c.want)
		}
	}
}
