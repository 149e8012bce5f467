// Package kubernetes runs each task's sandbox as one batch/v1 Job in a
// configured namespace (private clusters, optionally with a Kata or gVisor
// RuntimeClass). The runner's environment travels in a per-task Secret
// that the Job's pod reads with envFrom and that is owned by the Job, so
// Kubernetes deletes it with the Job. The Job's activeDeadlineSeconds
// enforces the task deadline and ttlSecondsAfterFinished cleans up.
//
// It talks to the API server through k8s.io/client-go (typed clientset,
// JSON on the wire), configured from a kubeconfig file (so exec credential
// plugins for EKS, GKE and AKS work), an explicit server with a token, or
// the in-cluster service account. client-go waits out Retry-After on 429
// and retries. It must not keep state of its own.
package kubernetes
