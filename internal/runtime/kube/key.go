package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sbx-sandbox/sbx/internal/executor/token"
)

// KeySecret is the Secret, in the control plane's namespace, that holds
// the key every replica signs executor tokens with
// (internal/executor/token). The first replica to start makes it; the
// others read it. No sandbox Pod can: they run in another namespace with
// no service-account token, and the executors are given only the public
// half.
const (
	KeySecret    = "sbx-executor-key"
	keySecretKey = "private-key"
)

// LoadSigner returns the signer of the key in namespace's KeySecret,
// making the key and the Secret if there is none yet. Two replicas that
// start at once agree: one Create wins, the other reads what it made.
func LoadSigner(ctx context.Context, client kubernetes.Interface, namespace string) (*token.Signer, error) {
	secrets := client.CoreV1().Secrets(namespace)
	for attempt := 0; attempt < 3; attempt++ {
		s, err := secrets.Get(ctx, KeySecret, metav1.GetOptions{})
		if err == nil {
			key, err := token.ParsePrivateKey(string(s.Data[keySecretKey]))
			if err != nil {
				return nil, fmt.Errorf("secret %s/%s: %w", namespace, KeySecret, err)
			}
			return token.NewSigner(key)
		}
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("secret %s/%s: %w", namespace, KeySecret, apiErr(err))
		}
		_, key, err := token.GenerateKey()
		if err != nil {
			return nil, err
		}
		_, err = secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: KeySecret, Namespace: namespace, Labels: map[string]string{labelManaged: labelManagedBy}},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{keySecretKey: []byte(token.EncodePrivateKey(key))},
		}, metav1.CreateOptions{})
		if err == nil {
			return token.NewSigner(key)
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("secret %s/%s: %w", namespace, KeySecret, apiErr(err))
		}
	}
	return nil, fmt.Errorf("secret %s/%s: made and gone again three times", namespace, KeySecret)
}
