// Package config reads the runner's configuration from environment variables (the struct tags
// of Config are the single list of variables) and validates it with errors that name the bad
// variable. It also builds the runner's mTLS client configuration from the task certificate. It
// must not read anything but the environment and the certificate files it names, and it never
// prints a secret value in an error.
package config
