package app

import (
	"context"
	"fmt"
	"log/slog"
	"os"

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
	// RuntimeClass runs every sandbox Pod under it (gVisor, say).
	RuntimeClass string
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
	return kube.New(kube.Config{
		Client: client, Namespace: k.Namespace, Registry: k.Registry, RuntimeClass: k.RuntimeClass,
		ImageSuffix: suffix, Signer: signer, Logger: log,
	})
}
