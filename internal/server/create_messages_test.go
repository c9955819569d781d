package server_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

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

// TestCreateUploadSizeOverflow is the attack on the 10 GB bound of
// file_upload_config: 2^33 GB is 2^63 bytes, which wrapped to a negative
// limit that passed it when the size was multiplied by its unit first.
func TestCreateUploadSizeOverflow(t *testing.T) {
	ts := start(t)
	for _, body := range []string{
		`{"session_id":"gb","file_upload_config":{"max_file_size":8589934592,"max_file_size_unit":"GB"}}`,
		`{"session_id":"kb","file_upload_config":{"max_file_size":18014398509481984,"max_file_size_unit":"KB"}}`,
		`{"session_id":"mb","file_upload_config":{"max_file_size":9223372036854775807}}`,
	} {
		resp, b := ts.do(t, "POST", "/api/v1/sessions", "application/json", strings.NewReader(body))
		if resp.StatusCode != 400 || !strings.Contains(string(b), "is more than 10 GB") {
			t.Errorf("%s: %d %s, want 400: more than 10 GB", body, resp.StatusCode, b)
		}
	}
}

// TestE2BCreateNamesItsFields: an E2B client reads E2B's names for the
// fields it sent (envVars, templateID), not REST's (env_vars,
// template_id), whose request E2B's create used to build.
func TestE2BCreateNamesItsFields(t *testing.T) {
	s := openE2BServer(t, t.TempDir(), time.Hour, "e2b_names_key_0001:t")
	defer s.app.Close()
	for body, want := range map[string]string{
		`{"envVars":{"A=B":"c"}}`:      `envVars: "A=B" is not a variable name ([A-Za-z_][A-Za-z0-9_]*): invalid argument`,
		`{"templateID":"Not/A/Name"}`:  `templateID "Not/A/Name" is not a template name ([a-z0-9-], at most 63 characters): invalid argument`,
		`{"metadata":{"a b":"c"}}`:     `metadata: key "a b": want 1-64 characters of [A-Za-z0-9._-]: invalid argument`,
		`{"envVars":{"A":"b\u0000c"}}`: `envVars: the value of A contains NUL: invalid argument`,
	} {
		code, resp, _ := s.call("POST", "/sandboxes", []byte(body), "X-API-Key", "e2b_names_key_0001", "Content-Type", "application/json")
		var e struct {
			Message string `json:"message"`
		}
		if err := json.Unmarshal([]byte(resp), &e); err != nil || code != 400 || e.Message != want {
			t.Errorf("%s: %d %s\nwant 400 saying %s", body, code, resp, want)
		}
	}
}
