package main

import (
	"testing"

	"github.com/sbx-sandbox/sbx/internal/executor/token"
)

func TestNetworkAuth(t *testing.T) {
	pub, _, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	key := token.EncodePublicKey(pub)
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	none := env(nil)
	for _, tc := range []struct {
		name                 string
		listen, key, sandbox string
		getenv               func(string) string
		ok, verifier         bool
	}{
		{name: "unix socket", getenv: none, ok: true},
		{name: "tcp with flags", listen: ":8080", key: key, sandbox: "sb-1", getenv: none, ok: true, verifier: true},
		{name: "tcp with env", listen: ":8080", getenv: env(map[string]string{envPublicKey: key + "\n", envSandboxID: "sb-1"}), ok: true, verifier: true},
		{name: "tcp without key", listen: ":8080", sandbox: "sb-1", getenv: none},
		{name: "tcp without sandbox id", listen: ":8080", key: key, getenv: none},
		{name: "tcp with nothing", listen: ":8080", getenv: none},
		{name: "tcp with a bad key", listen: ":8080", key: "bm90IGEga2V5", sandbox: "sb-1", getenv: none},
		{name: "tcp with a bad id", listen: ":8080", key: key, sandbox: "../sb", getenv: none},
		{name: "key without tcp", key: key, sandbox: "sb-1", getenv: none},
		{name: "env without tcp", getenv: env(map[string]string{envSandboxID: "sb-1"})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := networkAuth(tc.listen, tc.key, tc.sandbox, tc.getenv)
			if (err == nil) != tc.ok || (v != nil) != tc.verifier {
				t.Fatalf("networkAuth = %v, %v", v, err)
			}
		})
	}
}
