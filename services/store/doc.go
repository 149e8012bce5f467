// Package store owns the PostgreSQL connection pool, the embedded numbered
// schema migrations and the transaction helper shared by every service's data
// layer. It knows no service's tables beyond the migrations: each service keeps
// its own small store interface and SQL next to its code.
package store
