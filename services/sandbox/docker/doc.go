// Package docker runs each task's sandbox as one container on a Docker
// Engine (a private VPS), through the Engine API client
// github.com/moby/moby/client. Containers are named after the task and
// carry the taskrunner labels, so Create is idempotent and a restarted
// control plane finds its containers by label. Every container is
// hardened: all capabilities dropped, no-new-privileges, a read-only root
// with a per-container workspace volume and a /tmp tmpfs, memory, CPU and
// process limits, and the gVisor or Kata runtime when configured. It must
// not hold state of its own (the engine's container list is the truth) and
// must never put a GitHub token into a container's environment: it passes
// Spec.Env verbatim.
package docker
