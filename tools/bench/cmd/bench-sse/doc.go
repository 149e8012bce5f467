// Command bench-sse measures the gateway's SSE fan-out (taskrunner's
// events through the Events service, PostgreSQL, Redis and the gateway's
// hub) against Mercure embedded as a library, scenario by scenario in one
// run, and prints both, their ratios and issue 17's goals. See
// tools/bench/README.md.
package main
