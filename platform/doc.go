// Package platform is the root of the leaf module that every taskrunner
// process may link: it depends only on the proto module (and, where a
// package needs it, OpenTelemetry), never on the database, Redis clients or
// the services. Its packages hold rules that several processes must apply
// identically, such as the wire format of a task's timeline (eventwire).
package platform
