// Package browsertest runs the web console's browser tests: console.mjs, a
// Node.js script that drives Debian's headless Chromium (/usr/bin/chromium)
// with playwright-core (pinned in the root package.json; it never downloads
// a browser).
//
// The script needs a running gateway that serves the console and the API
// (`make run`, or the end-to-end test's stack) and an API token:
//
//	BASE_URL=http://127.0.0.1:8080 TOKEN_FILE=.dev/token OUT_DIR=.dev/browsertest \
//	  node tools/browsertest/console.mjs
//
// Go tests call Run, which does the same with a context, and returns an
// error that quotes the script's explanation when a scenario fails.
// The scenarios and the artifacts (PNG screenshots and result.json in
// OUT_DIR) are described at the top of console.mjs. CrossOrigin serves the
// cors scenario's page (cors.html) from two other origins, one for the
// gateway's TASKRUNNER_CORS_ORIGINS and one it must refuse.
package browsertest
