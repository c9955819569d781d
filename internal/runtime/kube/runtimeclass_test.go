package kube

import (
	"context"
	"errors"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor/token"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

func classRuntime(t *testing.T, classes map[string]string) (*Runtime, error) {
	t.Helper()
	_, key, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	signer, err := token.NewSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	return New(Config{Client: fake.NewClientset(), Namespace: testNS, Signer: signer, RuntimeClasses: classes})
}

// A sandbox Pod runs under the RuntimeClass mapped for its template's
// runtime; a template of runsc (or crun) with none mapped does not start,
// and no Pod is made for it: it must not run under runc unnoticed.
func TestRuntimeClassPerTemplate(t *testing.T) {
	for _, tc := range []struct {
		classes  map[string]string
		template string
		want     string // "" none; "!" refused
		err      error
	}{
		{nil, "", "", nil},
		{nil, "runc", "", nil},
		{nil, "runsc", "!", errdefs.ErrFailedPrecondition},
		{nil, "crun", "!", errdefs.ErrFailedPrecondition},
		{map[string]string{"runsc": "gvisor"}, "runsc", "gvisor", nil},
		{map[string]string{"runsc": "gvisor"}, "", "", nil},
		{map[string]string{"runsc": "gvisor"}, "crun", "!", errdefs.ErrFailedPrecondition},
		{map[string]string{"runc": "kata", "runsc": "gvisor"}, "", "kata", nil},
		{map[string]string{"runc": "kata", "runsc": "gvisor"}, "runc", "kata", nil},
		{map[string]string{"runc": "kata", "runsc": "gvisor"}, "runsc", "gvisor", nil},
		{map[string]string{"runsc": "gvisor"}, "docker", "!", errdefs.ErrInvalidArgument},
		{map[string]string{"runsc": "gvisor"}, strings.Repeat("r", 1<<16), "!", errdefs.ErrInvalidArgument},
	} {
		rt, err := classRuntime(t, tc.classes)
		if err != nil {
			t.Fatal(err)
		}
		spec := runtime.Spec{ID: "s1", Image: "sbx/python:" + buildA, Runtime: tc.template, Volume: workspace.SessionVolume("t", "s1")}
		pod, err := rt.podSpec(spec, spec.Image, spec.Resources.WithDefaults())
		name := tc.template[:min(len(tc.template), 16)]
		if tc.want == "!" {
			if !errors.Is(err, tc.err) || len(err.Error()) > 400 {
				t.Errorf("%v, template of %s: %v, want %v (in a few words)", tc.classes, name, err, tc.err)
			}
			_, cerr := rt.Create(context.Background(), spec)
			if !errors.Is(cerr, tc.err) {
				t.Errorf("%v, template of %s: create: %v, want %v", tc.classes, name, cerr, tc.err)
			}
			if list, _ := rt.pods().List(context.Background(), metav1.ListOptions{}); len(list.Items) != 0 {
				t.Errorf("%v, template of %s: a Pod was made", tc.classes, name)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v, template of %s: %v", tc.classes, name, err)
		}
		got := ""
		if pod.Spec.RuntimeClassName != nil {
			got = *pod.Spec.RuntimeClassName
		}
		if got != tc.want {
			t.Errorf("%v, template of %s: runtimeClassName %q, want %q", tc.classes, name, got, tc.want)
		}
	}
}

// A mapping from something no template declares, or to something that
// cannot name a RuntimeClass, is refused when the runtime is made.
func TestRuntimeClassesChecked(t *testing.T) {
	for _, classes := range []map[string]string{
		{"docker": "x"},
		{"": "x"},
		{"runsc": ""},
		{"runsc": "gVisor"},
		{"runsc": "a/b"},
		{"runsc": strings.Repeat("a", 254)},
	} {
		if _, err := classRuntime(t, classes); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("runtime classes %q: %v, want ErrInvalidArgument", classes, err)
		}
	}
}
