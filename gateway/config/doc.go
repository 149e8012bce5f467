// Package config reads the gateway's configuration from environment variables
// and validates it, naming the offending variable in every error.
package config
