package kube

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// A node that cannot make a Pod's sandbox says so only in an event
// (FailedCreatePodSandBox): the Pod stays Pending, its container
// ContainerCreating, and the kubelet tries again and again. Some of these
// refusals no retry mends, and a Create should not wait out its
// StartTimeout for them: a RuntimeClass whose handler the node's runtime
// does not have (containerd: "no runtime for "gvisor" is configured"),
// or a Pod asking for a user namespace of a runtime without them (the
// kubelet: "runtime does not support user namespaces"; containerd 1.6).
// Others (the network not ready yet, say) may mend, and are waited out.
const reasonFailedSandbox = "FailedCreatePodSandBox"

// sandboxRefusals are the words of the refusals no retry mends.
var sandboxRefusals = []string{
	"no runtime for",                    // containerd: the RuntimeClass's handler
	"does not support user namespaces",  // the kubelet: hostUsers false
	"user namespaces are not supported", // the same, as other versions say it
}

// maxRefusalMessage bounds how much of an event's message an error
// repeats.
const maxRefusalMessage = 512

// sandboxRefusal is the error of an event that says pod's sandbox will
// never be made, or nil.
func sandboxRefusal(pod *corev1.Pod, ev *corev1.Event) error {
	if ev.Reason != reasonFailedSandbox || ev.InvolvedObject.Name != pod.Name || ev.InvolvedObject.UID != pod.UID {
		return nil
	}
	for _, words := range sandboxRefusals {
		if strings.Contains(ev.Message, words) {
			msg := ev.Message
			if len(msg) > maxRefusalMessage {
				msg = msg[:maxRefusalMessage] + "..."
			}
			return fmt.Errorf("the node cannot make its sandbox: %s: %w", msg, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

// watchSandboxRefusal watches pod's events until ctx ends, and sends the
// first refusal no retry mends. Without the right to read events (a
// deployment's Role that lacks it) it warns once and sends nothing: such
// a Pod then waits out the start's timeout.
func (r *Runtime) watchSandboxRefusal(ctx context.Context, pod *corev1.Pod) <-chan error {
	out := make(chan error, 1)
	sel := fields.Set{"involvedObject.name": pod.Name, "reason": reasonFailedSandbox}.AsSelector().String()
	w, err := r.cfg.Client.CoreV1().Events(r.cfg.Namespace).Watch(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		if ctx.Err() == nil {
			r.warnEvents.Do(func() {
				r.log.Warn("kubernetes: cannot watch the sandbox namespace's events; a Pod its node cannot make waits out the start timeout",
					"namespace", r.cfg.Namespace, "err", err, "forbidden", apierrors.IsForbidden(err))
			})
		}
		return out
	}
	go func() {
		defer w.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.ResultChan():
				if !ok {
					return // the server ended the watch: the pod watch still bounds the wait
				}
				e, isEvent := ev.Object.(*corev1.Event)
				if !isEvent || ev.Type != watch.Added && ev.Type != watch.Modified {
					continue
				}
				if err := sandboxRefusal(pod, e); err != nil {
					out <- err
					return
				}
			}
		}
	}()
	return out
}
