// Package faults is the fault suite of issue 19 (make test-faults): each
// test starts its own PostgreSQL (initdb and pg_ctl on a free port in a
// temporary directory) and its own Redis (redis-server on a free port) so
// that it can stop them, runs the real taskrunnerd binary, kills or stops
// one thing at a time while runners stream, and asserts that nothing was
// lost or duplicated, that every task reached the right final status, and
// how long recovery took. Runners here are fake: they speak the runner
// protocol through runner/eventsclient (as tools/bench does), so a test
// controls exactly what is streamed and when.
//
// It must never touch the shared PostgreSQL and Redis of `make test`, and
// its tests are not part of `make test` (they take minutes): they run only
// when TASKRUNNER_FAULTS=1.
package faults
