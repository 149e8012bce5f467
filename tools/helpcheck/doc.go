// Package helpcheck holds the test that keeps secrets out of every binary's
// help and configuration errors: it builds taskrunnerd, the gateway, the
// runner, devstack, forge, modelapi and taskctl, runs their --help (and
// every taskctl command's) with secret-looking values in the environment,
// and fails if a value shows up. It also requires an example in every
// taskctl command's help. It has no non-test code.
package helpcheck
