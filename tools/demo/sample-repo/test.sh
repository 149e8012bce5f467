#!/bin/sh
# test.sh: run the tests of greet. Prints one "ok"/"not ok" line per case and
# exits non-zero when any case fails.
set -u
cd "$(dirname "$0")"

failed=0
check() {
	want="$1"
	shift
	got="$(sh ./greet "$@" 2>&1)"
	if [ "$got" = "$want" ]; then
		echo "ok - greet $*"
	else
		echo "not ok - greet $*: got '$got', want '$want'"
		failed=1
	fi
}

check "Hello, world!"
check "Hello, Ada!" Ada
check "usage: greet [NAME]" --help

if [ "$failed" -ne 0 ]; then
	echo "FAIL"
	exit 1
fi
echo "PASS"
