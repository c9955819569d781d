package kube

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor/token"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// createRefused runs a Create on a fake cluster whose node answers the
// Pod with an event of message, and returns Create's error.
func createRefused(t *testing.T, message string, forbidEvents bool, timeout time.Duration) error {
	t.Helper()
	_, key, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	signer, err := token.NewSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientset()
	// The node's answer to the Pod, as the kubelet records it: once the
	// runtime watches the events (the fake replays none from before).
	c.PrependWatchReactor("events", func(a k8stesting.Action) (bool, watch.Interface, error) {
		if forbidEvents {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "events"}, "", errors.New("no"))
		}
		w, err := c.Tracker().Watch(schema.GroupVersionResource{Version: "v1", Resource: "events"}, a.GetNamespace())
		if err != nil {
			return true, nil, err
		}
		pods, _ := c.Tracker().List(podsGVR, schema.GroupVersionKind{Version: "v1", Kind: "Pod"}, a.GetNamespace())
		for _, pod := range pods.(*corev1.PodList).Items {
			ev := &corev1.Event{
				ObjectMeta:     metav1.ObjectMeta{Name: pod.Name + ".1", Namespace: pod.Namespace},
				InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID},
				Reason:         "FailedCreatePodSandBox", Type: corev1.EventTypeWarning, Message: message,
			}
			go c.Tracker().Create(schema.GroupVersionResource{Version: "v1", Resource: "events"}, ev, pod.Namespace)
		}
		return true, w, nil
	})
	rt, err := New(Config{Client: c, Namespace: testNS, Signer: signer, StartTimeout: timeout, UserNamespaces: true,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	spec := runtime.Spec{ID: "s1", Image: "sbx/python:" + buildA, Volume: workspace.SessionVolume("t", "s1")}
	_, err = rt.Create(context.Background(), spec)
	if list, _ := rt.pods().List(context.Background(), metav1.ListOptions{}); len(list.Items) != 0 {
		t.Errorf("a failed create left its Pod")
	}
	return err
}

// TestCreateRefusedByTheNode: a Pod its node will never make (user
// namespaces on a runtime without them, a RuntimeClass whose handler the
// node lacks) fails its Create at once with the node's words, not at the
// end of the start timeout; a refusal that may mend (the network not
// ready) is waited out.
func TestCreateRefusedByTheNode(t *testing.T) {
	for _, msg := range []string{
		"Failed to create pod sandbox: can't set `spec.hostUsers: false`, runtime does not support user namespaces",
		`Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get sandbox runtime: no runtime for "gvisor" is configured`,
	} {
		err := createRefused(t, msg, false, 10*time.Minute)
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), msg[len("Failed to create pod sandbox: "):]) {
			t.Errorf("create refused with %q: %v, want ErrFailedPrecondition with the node's words", msg, err)
		}
	}
	long := "Failed to create pod sandbox: runtime does not support user namespaces" + strings.Repeat(" x", 1<<16)
	if err := createRefused(t, long, false, 10*time.Minute); err == nil || len(err.Error()) > 2*maxRefusalMessage {
		t.Errorf("create refused with a 128 KiB message: an error of %d bytes", len(err.Error()))
	}
	// Mends, maybe: the start waits (here its short timeout).
	err := createRefused(t, "Failed to create pod sandbox: plugin type=\"bridge\" failed (add): failed to set bridge addr", false, 500*time.Millisecond)
	if errors.Is(err, errdefs.ErrFailedPrecondition) || !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("create with a network error: %v, want the start's timeout (ErrUnavailable)", err)
	}
	// No right to read events: the start waits out its timeout.
	err = createRefused(t, "Failed to create pod sandbox: runtime does not support user namespaces", true, 500*time.Millisecond)
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("create without the events: %v, want the start's timeout (ErrUnavailable)", err)
	}
}
