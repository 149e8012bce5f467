// Package proto is the buf module holding taskrunner's API contract
// (taskrunner/v1/*.proto and the public HTTP rules) and the Go code generated
// from it under gen/. Nothing here is written by hand except this file,
// openapi/openapi.go and the .proto/.yaml sources; `make proto` regenerates the rest.
package proto
