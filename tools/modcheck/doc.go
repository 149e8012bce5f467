// Package modcheck holds the repository's module-boundary checks, run by
// `make test` as ordinary Go tests:
//
//   - TestProcessImports: module imports match the processes. The gateway
//     and runner binaries (and every non-test package of their modules) link
//     only proto, platform and third-party libraries: no services package,
//     no tools package, no PostgreSQL driver, no migrations, no Prometheus
//     client. platform links only proto. The runner never links the gateway
//     and the other way round.
//   - TestModulesBuildAlone: every module builds with GOWORK=off, through
//     the replace directives in its go.mod.
//   - TestModulesTidy: `go mod tidy -diff` reports nothing in any module
//     (GOWORK=off; it needs the Go module proxy, as the build does).
//
// The tests run the go command; they take a minute or two on a cold build
// cache. TASKRUNNER_SKIP_MODCHECK=1 skips the two slow ones.
package modcheck
