// Package deploytest checks the deployment files under deploy/ (Dockerfiles, the Compose
// file, the Kubernetes manifests, fly.toml) by parsing them with the libraries the real
// tools use: compose-go, k8s.io/api with strict decoding, buildkit's Dockerfile parser and
// go-toml. It also cross-checks every environment variable the files name against the
// binaries' configuration structs, so deploy files cannot drift from the code.
//
// It holds tests only and must not start containers, reach a cluster or touch the network:
// what only a real engine can prove (that images build and services come up) is out of scope.
package deploytest
