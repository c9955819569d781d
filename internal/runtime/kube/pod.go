package kube

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor/token"
	"github.com/sbx-sandbox/sbx/internal/runtime"
)

// Labels and annotations sbx puts on the Pods it makes. The label selects
// them (List, the NetworkPolicy); the annotations carry what Info
// reports, since a label value cannot hold an arbitrary sandbox id or the
// caller's labels.
const (
	labelManaged     = "app.kubernetes.io/managed-by"
	labelManagedBy   = "sbx"
	labelComponent   = "app.kubernetes.io/component"
	componentSandbox = "sandbox"

	annotationID      = "sbx.dev/id"
	annotationImage   = "sbx.dev/image"
	annotationVolume  = "sbx.dev/volume"
	annotationLabels  = "sbx.dev/labels"
	annotationRes     = "sbx.dev/resources"
	annotationEnv     = "sbx.dev/env"
	annotationStopped = "sbx.dev/stopped"
)

// Paths inside the sandbox's container; the template images hold the
// mount points (internal/image).
const (
	containerName  = "sandbox"
	executorBinary = "/opt/sbx/sbx-executor"
	workspaceDir   = "/workspace"
	controlDir     = "/run/sbx"
	metaDir        = "/run/sbx-meta"
	envFile        = metaDir + "/env.json"
)

// podName is the Pod of sandbox id. A sandbox id may hold capitals and
// underscores, which a Pod name may not, and be 64 characters long: such
// ids are named by a hash. An id that is already a valid name keeps it,
// so that `kubectl get pods` reads like the API; the two forms never
// meet, since plain names never start with "x-".
func podName(id string) string { return PodName(id) }

// PodName is the name of sandbox id's Pod.
func PodName(id string) string {
	plain := !strings.HasPrefix(id, "x-") && len(id) <= 59
	for i := 0; plain && i < len(id); i++ {
		c := id[i]
		plain = c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' && i > 0 && i < len(id)-1
	}
	if plain {
		return "sbx-" + id
	}
	sum := sha256.Sum256([]byte(id))
	return "sbx-x-" + hex.EncodeToString(sum[:16])
}

// validID is what a sandbox id may look like (runtime.Spec.ID).
func validID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || i > 0 && (c == '_' || c == '-')
		if !ok {
			return false
		}
	}
	return true
}

// executorCaps are what the executor keeps in the Pod: to drop to the
// sandbox user (SETUID, SETGID), kill user code (KILL) and serve the
// workspace's files as the sandbox's root (CHOWN, DAC_OVERRIDE, FOWNER,
// raised per call: internal/executor/filecaps.go). User code has none
// of them. A Pod has no user namespace of its own here (hostUsers:
// false needs containerd 2 and runc 1.2), so these are the host's
// capabilities over what the container can reach: no SYS_ADMIN, no
// NET_*, nothing that reaches beyond the container's own files and
// processes.
var executorCaps = []corev1.Capability{"CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETPCAP", "SETUID"}

// podSpec is the Pod of a sandbox.
func (r *Runtime) podSpec(spec runtime.Spec, image string, res runtime.Resources) (*corev1.Pod, error) {
	labels, err := json.Marshal(spec.Labels)
	if err != nil {
		return nil, err
	}
	resJSON, err := json.Marshal(res)
	if err != nil {
		return nil, err
	}
	env := spec.Env
	if env == nil {
		env = map[string]string{}
	}
	envJSON, err := json.Marshal(env)
	if err != nil {
		return nil, err
	}
	class, err := r.runtimeClass(spec.Runtime)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	podLabels := map[string]string{labelManaged: labelManagedBy, labelComponent: componentSandbox, labelVolume: volumeLabel(spec.Volume)}
	maps.Copy(podLabels, r.cfg.PodLabels)

	args := []string{
		"--unprivileged",
		"--listen", ":" + strconv.Itoa(r.cfg.Port),
		"--auth-public-key", token.EncodePublicKey(r.cfg.Signer.PublicKey()),
		"--sandbox-id", spec.ID,
		"--env-file", envFile,
	}
	if len(spec.Preload) > 0 {
		args = append(args, "--preload", strings.Join(spec.Preload, ","))
	}
	cpu := resource.NewMilliQuantity(int64(res.CPU*1000), resource.DecimalSI)
	mem := resource.NewQuantity(res.MemoryMB<<20, resource.BinarySI)
	reqCPU := resource.NewMilliQuantity(min(int64(res.CPU*1000), r.cfg.RequestMilliCPU), resource.DecimalSI)
	reqMem := resource.NewQuantity(min(res.MemoryMB<<20, r.cfg.RequestMemoryMB<<20), resource.BinarySI)
	disk := resource.NewQuantity(res.DiskMB<<20, resource.BinarySI)
	tmp := resource.NewQuantity(res.TmpMB<<20, resource.BinarySI)
	control := resource.NewQuantity(16<<20, resource.BinarySI)
	grace := int64(0)
	yes, no := true, false
	root := int64(0)

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      podName(spec.ID),
			Namespace: r.cfg.Namespace,
			Labels:    podLabels,
			Annotations: map[string]string{
				annotationID:     spec.ID,
				annotationImage:  spec.Image,
				annotationVolume: spec.Volume,
				annotationLabels: string(labels),
				annotationRes:    string(resJSON),
				annotationEnv:    string(envJSON),
			},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			// No DNS: a sandbox reaches nothing by name; names
			// resolve only through what sbx controls.
			DNSPolicy: corev1.DNSNone,
			DNSConfig: &corev1.PodDNSConfig{Nameservers: []string{"127.0.0.1"}},
			HostUsers: r.cfg.hostUsers(),
			SecurityContext: &corev1.PodSecurityContext{
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			RuntimeClassName: class,
			Containers: []corev1.Container{{
				Name:            containerName,
				Image:           image,
				ImagePullPolicy: r.cfg.PullPolicy,
				Command:         []string{executorBinary},
				Args:            args,
				WorkingDir:      workspaceDir,
				Ports:           []corev1.ContainerPort{{Name: "executor", ContainerPort: int32(r.cfg.Port), Protocol: corev1.ProtocolTCP}},
				Resources: corev1.ResourceRequirements{
					Limits: corev1.ResourceList{
						corev1.ResourceCPU: *cpu, corev1.ResourceMemory: *mem,
						corev1.ResourceEphemeralStorage: *disk,
					},
					Requests: corev1.ResourceList{corev1.ResourceCPU: *reqCPU, corev1.ResourceMemory: *reqMem},
				},
				SecurityContext: &corev1.SecurityContext{
					RunAsUser:                &root,
					RunAsNonRoot:             &no,
					Privileged:               &no,
					AllowPrivilegeEscalation: &no,
					ReadOnlyRootFilesystem:   &yes,
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: executorCaps},
					SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "workspace", MountPath: workspaceDir},
					{Name: "tmp", MountPath: "/tmp"},
					{Name: "control", MountPath: controlDir},
					{Name: "meta", MountPath: metaDir, ReadOnly: true},
				},
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}},
			Volumes: []corev1.Volume{
				{Name: "workspace", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: disk}}},
				{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: tmp}}},
				{Name: "control", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: control}}},
				{Name: "meta", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
					Items: []corev1.DownwardAPIVolumeFile{{Path: "env.json", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['" + annotationEnv + "']"}}},
				}}},
			},
		},
	}
	if len(r.cfg.NodeSelector) > 0 {
		pod.Spec.NodeSelector = maps.Clone(r.cfg.NodeSelector)
	}
	return pod, nil
}

// info is what a Pod says of its sandbox; ok is false for a Pod sbx did
// not make.
func (r *Runtime) info(pod *corev1.Pod) (runtime.Info, bool) {
	a := pod.Annotations
	id := a[annotationID]
	if id == "" || pod.Labels[labelManaged] != labelManagedBy || pod.Labels[labelComponent] != componentSandbox {
		return runtime.Info{}, false
	}
	info := runtime.Info{
		ID:        id,
		State:     podState(pod),
		Runtime:   "kubernetes",
		Image:     a[annotationImage],
		Volume:    a[annotationVolume],
		CreatedAt: pod.CreationTimestamp.Time,
	}
	if s := a[annotationLabels]; s != "" && s != "null" {
		if err := json.Unmarshal([]byte(s), &info.Labels); err != nil {
			r.log.Warn("kubernetes: a sandbox Pod's labels do not parse", "pod", pod.Name, "err", err)
		}
	}
	if s := a[annotationRes]; s != "" {
		if err := json.Unmarshal([]byte(s), &info.Resources); err != nil {
			r.log.Warn("kubernetes: a sandbox Pod's resources do not parse", "pod", pod.Name, "err", err)
		}
	}
	return info, true
}

// podState maps a Pod's phase and its container's state onto a
// sandbox's. A Pod that is going away, was told to stop, or whose
// container ended is stopped: it will never run code again.
func podState(pod *corev1.Pod) runtime.State {
	if pod.DeletionTimestamp != nil || pod.Annotations[annotationStopped] != "" {
		return runtime.StateStopped
	}
	switch pod.Status.Phase {
	case corev1.PodSucceeded, corev1.PodFailed:
		return runtime.StateStopped
	case corev1.PodRunning:
		for _, cs := range pod.Status.ContainerStatuses {
			if cs.Name == containerName && cs.State.Terminated != nil {
				return runtime.StateStopped
			}
		}
		return runtime.StateRunning
	}
	return runtime.StateCreating
}

// failure says why a Pod cannot start, or nil while it still may: an
// image that cannot be had or a container that cannot be made will not fix
// itself, and Create should not wait out its timeout for them. An image
// the node does not have and may not pull, or that its registry does not
// know, is ErrNotFound.
func failure(pod *corev1.Pod) error {
	if pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
		return fmt.Errorf("pod %s ended (%s): %s: %w", pod.Name, pod.Status.Phase, podMessage(pod), errdefs.ErrUnavailable)
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			switch w.Reason {
			case "ErrImageNeverPull":
				return fmt.Errorf("pod %s: image %s is not on the node: %w", pod.Name, cs.Image, errdefs.ErrNotFound)
			case "ErrImagePull", "ImagePullBackOff":
				if strings.Contains(w.Message, "not found") {
					return fmt.Errorf("pod %s: image %s: %s: %w", pod.Name, cs.Image, w.Message, errdefs.ErrNotFound)
				}
				return fmt.Errorf("pod %s: %s: %s: %w", pod.Name, w.Reason, w.Message, errdefs.ErrUnavailable)
			case "InvalidImageName", "CreateContainerConfigError", "CreateContainerError", "RunContainerError":
				return fmt.Errorf("pod %s: %s: %s: %w", pod.Name, w.Reason, w.Message, errdefs.ErrUnavailable)
			}
		}
		if t := cs.State.Terminated; t != nil {
			return fmt.Errorf("pod %s: the executor exited (%s, code %d): %s: %w", pod.Name, t.Reason, t.ExitCode, t.Message, errdefs.ErrUnavailable)
		}
	}
	return nil
}

func podMessage(pod *corev1.Pod) string {
	msg := pod.Status.Reason
	if pod.Status.Message != "" {
		msg += " " + pod.Status.Message
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil {
			msg += fmt.Sprintf(" (container %s: %s, code %d: %s)", cs.Name, t.Reason, t.ExitCode, t.Message)
		}
	}
	return strings.TrimSpace(msg)
}

// SandboxUID is the user code runs as in a sandbox Pod, and the owner of
// its workspace's files.
const SandboxUID = 1000
