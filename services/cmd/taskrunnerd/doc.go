// Command taskrunnerd serves any subset of taskrunner's gRPC services
// (task, dispatch, githubtoken, events) on one port, and applies database
// migrations with `taskrunnerd migrate`. It is the only place that reads
// signals.
package main
