// Package config reads taskrunnerd's configuration from environment variables
// (struct tags are the single list of variables, which deploy tests check)
// and validates it with errors that name the offending variable.
package config
