package workspace

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseNumstat(t *testing.T) {
	out := "3\t1\tgreet\n10\t0\topenspec/specs/greet/spec.md\n-\t-\tlogo.png\n0\t0\t{a => b}/x\n"
	require.Equal(t, Stats{Additions: 13, Deletions: 1, FilesChanged: 4}, ParseNumstat(out))
	require.Equal(t, Stats{}, ParseNumstat(""))
}

func TestClassify(t *testing.T) {
	cases := []struct {
		out  string
		want Kind
	}{
		{"fatal: could not read Username for 'http://127.0.0.1:1': terminal prompts disabled", KindAuth},
		{"fatal: Authentication failed for 'https://github.com/o/r.git/'", KindAuth},
		{"fatal: unable to access 'x': The requested URL returned error: 403", KindAuth},
		{"fatal: repository 'http://h/acme/missing.git/' not found", KindRepoNotFound},
		{"warning: Could not find remote branch dev to clone.\nfatal: Remote branch dev not found in upstream origin", KindBranchNotFound},
		{"fatal: early EOF", KindOther},
	}
	for _, tc := range cases {
		require.Equal(t, tc.want, classify(tc.out), tc.out)
	}
}

func TestAuthEnvKeepsTheTokenOutOfArgv(t *testing.T) {
	env := authEnv("ghs_secret")
	require.Equal(t, []string{"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=http.extraHeader",
		"GIT_CONFIG_VALUE_0=Authorization: Basic eC1hY2Nlc3MtdG9rZW46Z2hzX3NlY3JldA=="}, env)
	require.Nil(t, authEnv(""))
}
