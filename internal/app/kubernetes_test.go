package app

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor/token"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/kube"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// TestParseRuntimeClasses: --runtime-class takes RUNTIME=CLASS, lists and
// repeats of them, and today's bare CLASS as runc's; anything else is
// refused before the server starts.
func TestParseRuntimeClasses(t *testing.T) {
	got, err := ParseRuntimeClasses([]string{"runsc=gvisor", " kata , crun=crun-class"})
	if err != nil || len(got) != 3 || got["runsc"] != "gvisor" || got["runc"] != "kata" || got["crun"] != "crun-class" {
		t.Errorf("classes: %v, %v", got, err)
	}
	if got, err := ParseRuntimeClasses(nil); err != nil || len(got) != 0 {
		t.Errorf("no flag: %v, %v", got, err)
	}
	for _, bad := range [][]string{
		{"runsc=gvisor", "runsc=other"}, {"kata", "runc=other"}, {"docker=x"}, {"runsc=Not_A_Name"},
		{"runsc="}, {"=gvisor"}, {"runsc=a=b"},
	} {
		if got, err := ParseRuntimeClasses(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%q: %v, %v; want ErrInvalidArgument", bad, got, err)
		}
	}
}

// TestKubernetesPodSpec: what sbx serve's Kubernetes settings make of a
// sandbox Pod: the RuntimeClass of its template's runtime, and with user
// namespaces hostUsers false (without: the field unset, the cluster's
// default, the host's).
func TestKubernetesPodSpec(t *testing.T) {
	_, key, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	signer, err := token.NewSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		userNS   bool
		template string
		class    string
	}{{true, "runsc", "gvisor"}, {false, "runsc", "gvisor"}, {true, "", ""}, {false, "runc", ""}} {
		k := Kubernetes{Namespace: "ns", RuntimeClasses: map[string]string{"runsc": "gvisor"}, UserNamespaces: tc.userNS}
		client := fake.NewClientset()
		made := make(chan *corev1.Pod, 1)
		client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
			made <- a.(k8stesting.CreateAction).GetObject().(*corev1.Pod).DeepCopy()
			return true, nil, errors.New("noted")
		})
		rt, err := kube.New(k.runtimeConfig(client, signer, "-x1", slog.New(slog.DiscardHandler)))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err = rt.Create(ctx, runtime.Spec{ID: "s1", Image: "sbx/python:" + hash64, Runtime: tc.template, Volume: workspace.SessionVolume("t", "s1")})
		cancel()
		rt.Close()
		if err == nil {
			t.Fatal("create: the fake made a Pod")
		}
		pod := <-made
		switch {
		case tc.userNS && (pod.Spec.HostUsers == nil || *pod.Spec.HostUsers):
			t.Errorf("with user namespaces: hostUsers %v, want false", pod.Spec.HostUsers)
		case !tc.userNS && pod.Spec.HostUsers != nil:
			t.Errorf("without user namespaces: hostUsers %v, want unset", *pod.Spec.HostUsers)
		}
		got := ""
		if pod.Spec.RuntimeClassName != nil {
			got = *pod.Spec.RuntimeClassName
		}
		if got != tc.class || pod.Namespace != "ns" || pod.Spec.Containers[0].Image != "sbx/python:"+hash64+"-x1" {
			t.Errorf("template of %q: class %q in %s of %s, want %q", tc.template, got, pod.Namespace, pod.Spec.Containers[0].Image, tc.class)
		}
	}
}

const hash64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
