// Package jaeger only pins the Jaeger binary as a Go tool (see go.mod); build it with
// `make jaeger`. It contains no code.
package jaeger
