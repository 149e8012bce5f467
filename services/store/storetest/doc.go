// Package storetest gives each integration test its own PostgreSQL database,
// cloned from a migrated template, and its own Redis key space, on the real
// servers named by TEST_DATABASE_URL and TEST_REDIS_URL. It must only be
// imported by tests.
package storetest
