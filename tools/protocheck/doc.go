// Package protocheck holds the tests that keep the API contract honest: buf
// lint must pass and regenerating the code must change nothing, so nobody
// edits generated files by hand. It has no non-test code.
package protocheck
