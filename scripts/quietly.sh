#!/usr/bin/env bash
# Run a noisy installer quietly:
#
#   scripts/quietly.sh LOG "what is being done" COMMAND [ARG...]
#
# Says in one line (on stderr) what is being done, runs COMMAND with all of its output kept in
# LOG, and exits with COMMAND's status. When COMMAND fails, LOG is printed in full, errors and
# all, then its path; when it succeeds, LOG stays for whoever wants to read it.
set -uo pipefail
if [[ $# -lt 3 ]]; then
    echo "usage: $0 LOG WHAT COMMAND [ARG...]" >&2
    exit 2
fi
log="$1" what="$2"
shift 2
mkdir -p "$(dirname "$log")"
echo "$what ..." >&2
"$@" >"$log" 2>&1 || {
    status=$?
    cat "$log" >&2
    echo "error: $what failed (exit status $status); the output above is kept in $log" >&2
    exit "$status"
}
