// Package sandbox defines the one small interface every sandbox provider
// implements (process, docker, fly, kubernetes, boxlite), modelled on the
// OpenSandbox lifecycle contract, and the labels that let the reaper find a
// task's sandbox after a restart. It must not know about tasks beyond the
// labels, nor hold state outside the provider: the provider's own listing is
// the source of truth.
package sandbox
