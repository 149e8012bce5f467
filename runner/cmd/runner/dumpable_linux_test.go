package main

import (
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestProtectSecrets(t *testing.T) {
	require.NoError(t, protectSecrets())
	v, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	require.NoError(t, err)
	require.Equal(t, 0, v)
	require.NoError(t, unix.Prctl(unix.PR_SET_DUMPABLE, 1, 0, 0, 0)) // leave the test binary as it was
}
