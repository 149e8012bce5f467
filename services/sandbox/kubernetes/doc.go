// Package kubernetes runs each task's sandbox as one batch/v1 Job in a
// configured namespace (private clusters, optionally with a Kata or gVisor
// RuntimeClass). The runner's environment travels in a per-task Secret
// that the Job's pod reads with envFrom and that is owned by the Job, so
// Kubernetes deletes it with the Job. The Job's activeDeadlineSeconds
// enforces the task deadline and ttlSecondsAfterFinished cleans up.
//
// It talks to the API server with net/http and the k8s.io/api types
// instead of k8s.io/client-go: the provider needs six REST calls, and
// client-go's typed clients pull in about 200 more packages and over
// 20 MB of binary. Consequently it authenticates with a bearer token
// (in-cluster service-account token by default) and a CA file only; it
// does not read kubeconfig files. It must not keep state of its own.
package kubernetes
