package githubtoken

import (
	"crypto/rsa"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Defaults.
const (
	DefaultAPIURL        = "https://api.github.com/"
	DefaultGitURL        = "https://github.com"
	DefaultCachePrefix   = "taskrunner:githubtoken:"
	DefaultRefreshBefore = 5 * time.Minute
	DefaultTimeout       = 15 * time.Second
	// installationTTL is how long the repository → installation mapping is cached. An
	// uninstalled App is noticed when minting fails (the entry is then dropped).
	installationTTL = time.Hour
	// jwtLifetime keeps exp − iat at GitHub's 10-minute maximum with iat backdated 60 s.
	jwtLifetime  = 9 * time.Minute
	jwtBackdate  = 60 * time.Second
	maxTokenLife = 24 * time.Hour
)

// Config configures the service. The env tags are the variables taskrunnerd reads
// (caarlos0/env); exactly one of App mode (AppID plus a key) and personal-token mode (Token)
// must be configured.
type Config struct {
	// APIURL is the REST API base: https://api.github.com/, https://ghe.example.com/api/v3/,
	// or the local forge's URL.
	APIURL string `env:"TASKRUNNER_GITHUB_API_URL" envDefault:"https://api.github.com/"`
	// GitURL is the base for git over HTTP; a clone URL is GitURL + "/" + owner/name + ".git".
	GitURL string `env:"TASKRUNNER_GITHUB_GIT_URL" envDefault:"https://github.com"`
	// AppID is the App's client id (recommended) or numeric app id: the JWT issuer.
	AppID string `env:"TASKRUNNER_GITHUB_APP_ID"`
	// AppKeyFile is a PEM RSA private key file (PKCS#1 or PKCS#8) of the App.
	AppKeyFile string `env:"TASKRUNNER_GITHUB_APP_KEY_FILE"`
	// AppKeyPEM is the same key as text (for platforms that inject secrets as variables).
	AppKeyPEM string `env:"TASKRUNNER_GITHUB_APP_KEY"`
	// Token is the personal token of personal-token mode (local use; no App).
	Token string `env:"TASKRUNNER_GITHUB_TOKEN"`
	// TrustDomain is the SPIFFE trust domain of runner certificates.
	TrustDomain string `env:"TASKRUNNER_TRUST_DOMAIN" envDefault:"taskrunner.local"`
	// CacheKey optionally encrypts cached tokens: 32 bytes, standard base64. When empty the
	// key is derived from the App's private key, which every replica already shares.
	CacheKey string `env:"TASKRUNNER_GITHUB_CACHE_KEY"`
	// CachePrefix prefixes every Redis key of this service.
	CachePrefix string `env:"TASKRUNNER_GITHUB_CACHE_PREFIX" envDefault:"taskrunner:githubtoken:"`
	// RefreshBefore is how long before expiry a cached token is replaced.
	RefreshBefore time.Duration `env:"TASKRUNNER_GITHUB_REFRESH_BEFORE" envDefault:"5m"`
	// Timeout bounds one GitHub API call.
	Timeout time.Duration `env:"TASKRUNNER_GITHUB_TIMEOUT" envDefault:"15s"`
}

// AppMode reports whether the config selects GitHub App mode.
func (c Config) AppMode() bool { return c.AppID != "" }

func (c *Config) setDefaults() {
	if c.APIURL == "" {
		c.APIURL = DefaultAPIURL
	}
	if c.GitURL == "" {
		c.GitURL = DefaultGitURL
	}
	if c.CachePrefix == "" {
		c.CachePrefix = DefaultCachePrefix
	}
	if c.RefreshBefore == 0 {
		c.RefreshBefore = DefaultRefreshBefore
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
}

// Validate names the offending variable in every error. It never includes a secret.
func (c Config) Validate() error {
	c.setDefaults()
	var errs []error
	for name, v := range map[string]string{"TASKRUNNER_GITHUB_API_URL": c.APIURL, "TASKRUNNER_GITHUB_GIT_URL": c.GitURL} {
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
			errs = append(errs, fmt.Errorf("%s: want an http(s) URL without credentials", name))
		}
	}
	hasKey := c.AppKeyFile != "" || c.AppKeyPEM != ""
	switch {
	case c.AppID != "" && c.Token != "":
		errs = append(errs, errors.New("TASKRUNNER_GITHUB_APP_ID and TASKRUNNER_GITHUB_TOKEN: set one mode, not both"))
	case c.AppID == "" && c.Token == "":
		errs = append(errs, errors.New("TASKRUNNER_GITHUB_APP_ID (App mode) or TASKRUNNER_GITHUB_TOKEN (personal-token mode) is required"))
	case c.AppID != "" && !hasKey:
		errs = append(errs, errors.New("TASKRUNNER_GITHUB_APP_KEY_FILE or TASKRUNNER_GITHUB_APP_KEY is required in App mode"))
	case c.AppID == "" && hasKey:
		errs = append(errs, errors.New("TASKRUNNER_GITHUB_APP_KEY_FILE/TASKRUNNER_GITHUB_APP_KEY need TASKRUNNER_GITHUB_APP_ID"))
	}
	if c.AppKeyFile != "" && c.AppKeyPEM != "" {
		errs = append(errs, errors.New("TASKRUNNER_GITHUB_APP_KEY_FILE and TASKRUNNER_GITHUB_APP_KEY: set one, not both"))
	}
	if strings.ContainsAny(c.Token, " \t\r\n") {
		errs = append(errs, errors.New("TASKRUNNER_GITHUB_TOKEN: contains white space"))
	}
	if c.TrustDomain == "" {
		errs = append(errs, errors.New("TASKRUNNER_TRUST_DOMAIN: must not be empty"))
	}
	if c.CacheKey != "" {
		if k, err := base64.StdEncoding.DecodeString(c.CacheKey); err != nil || len(k) != 32 {
			errs = append(errs, errors.New("TASKRUNNER_GITHUB_CACHE_KEY: want 32 bytes in standard base64"))
		}
	}
	if c.RefreshBefore < 0 || c.RefreshBefore >= 55*time.Minute {
		errs = append(errs, errors.New("TASKRUNNER_GITHUB_REFRESH_BEFORE: want a duration between 0 and 55m (tokens last 1h)"))
	}
	if c.Timeout < 0 {
		errs = append(errs, errors.New("TASKRUNNER_GITHUB_TIMEOUT: must not be negative"))
	}
	return errors.Join(errs...)
}

// appKey loads the App's private key. Errors describe the file, never its content.
func (c Config) appKey() (*rsa.PrivateKey, []byte, error) {
	data := []byte(c.AppKeyPEM)
	name := "TASKRUNNER_GITHUB_APP_KEY"
	if c.AppKeyFile != "" {
		name = "TASKRUNNER_GITHUB_APP_KEY_FILE"
		var err error
		if data, err = os.ReadFile(c.AppKeyFile); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	key, err := jwt.ParseRSAPrivateKeyFromPEM(data)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: not a PEM RSA private key", name)
	}
	return key, data, nil
}
