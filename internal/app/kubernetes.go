package app

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"k8s.io/client-go/kubernetes"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor/token"
	"github.com/sbx-sandbox/sbx/internal/image"
	"github.com/sbx-sandbox/sbx/internal/runtime/kube"
	"github.com/sbx-sandbox/sbx/internal/runtime/oci"
)

// Kubernetes says where sandbox Pods run.
type Kubernetes struct {
	// Kubeconfig is the cluster's kubeconfig file; empty: the cluster sbx
	// runs in (its Pod's service account).
	Kubeconfig string
	// Namespace is where sandbox Pods go. Default sbx-sandboxes.
	Namespace string
	// KeyNamespace holds the Secret of the executors' signing key
	// (kube.KeySecret): the control plane's own namespace, where no
	// sandbox is. Default: POD_NAMESPACE (the downward API's, in the
	// cluster), else Namespace.
	KeyNamespace string
	// Registry prefixes template images (kube.Config.Registry); empty:
	// images provided on the nodes.
	Registry string
	// RuntimeClasses maps a template's runtime (runc, crun, runsc) to the
	// RuntimeClass its sandbox Pods run under (kube.Config.RuntimeClasses;
	// ParseRuntimeClasses reads --runtime-class).
	RuntimeClasses map[string]string
	// UserNamespaces gives every sandbox Pod a user namespace of its own
	// (hostUsers: false; kube.Config.UserNamespaces).
	UserNamespaces bool
}

// ParseRuntimeClasses reads --runtime-class values: each a comma-separated
// list of RUNTIME=CLASS (a template's runtime, runc, crun or runsc, and
// the RuntimeClass its Pods run under) or a bare CLASS, which is
// runc=CLASS: the class of every template that names no other runtime,
// as the flag's single-class form always was. A runtime given twice, or
// a name kube.CheckRuntimeClasses refuses, is ErrInvalidArgument.
func ParseRuntimeClasses(values []string) (map[string]string, error) {
	out := map[string]string{}
	for _, v := range values {
		for _, item := range strings.Split(v, ",") {
			item = strings.TrimSpace(item)
			if item == "" {
				continue
			}
			name, class, ok := strings.Cut(item, "=")
			if !ok {
				name, class = "runc", item
			}
			name, class = strings.TrimSpace(name), strings.TrimSpace(class)
			if _, dup := out[name]; dup {
				return nil, fmt.Errorf("--runtime-class: %.64q is given twice: %w", name, errdefs.ErrInvalidArgument)
			}
			out[name] = class
		}
	}
	if err := kube.CheckRuntimeClasses(out); err != nil {
		return nil, fmt.Errorf("--runtime-class: %w", err)
	}
	return out, nil
}

// openKubernetes connects to the cluster and makes the Pod runtime.
func openKubernetes(ctx context.Context, k Kubernetes, executor string, log *slog.Logger) (*kube.Runtime, error) {
	if k.Namespace == "" {
		k.Namespace = "sbx-sandboxes"
	}
	// Pods run the template images of this sbx's executor.
	if executor == "" {
		var err error
		if executor, err = oci.FindExecutor(); err != nil {
			return nil, err
		}
	}
	suffix, err := image.ExecutorSuffix(executor)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: the executor template images hold: %w", err)
	}
	client, err := kube.Connect(k.Kubeconfig)
	if err != nil {
		return nil, err
	}
	if k.KeyNamespace == "" {
		k.KeyNamespace = os.Getenv("POD_NAMESPACE")
	}
	if k.KeyNamespace == "" {
		k.KeyNamespace = k.Namespace
	}
	signer, err := kube.LoadSigner(ctx, client, k.KeyNamespace)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: the executors' signing key: %w", err)
	}
	return kube.New(k.runtimeConfig(client, signer, suffix, log))
}

// runtimeConfig is the Pod runtime's configuration of k.
func (k Kubernetes) runtimeConfig(client kubernetes.Interface, signer *token.Signer, suffix string, log *slog.Logger) kube.Config {
	return kube.Config{
		Client: client, Namespace: k.Namespace, Registry: k.Registry,
		RuntimeClasses: k.RuntimeClasses, UserNamespaces: k.UserNamespaces,
		ImageSuffix: suffix, Signer: signer, Logger: log,
	}
}
