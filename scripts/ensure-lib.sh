#!/usr/bin/env bash
# The skeleton the scripts/ensure-*.sh share, sourced by them: look for a tool, and when it is
# missing either install it (as root, on a machine with apt-get) or say what to install.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/ensure-lib.sh"
#   find_tool() { first_executable "${PQ_TOOL:-}" tool /usr/bin/tool; }
#   find_or_install find_tool "tool" "install it with: apt-get install tool" tool-package
#
# find_or_install exits the script: 0 once FIND has printed what it found, 1 after its message.

# The first of CANDIDATES that is an executable file, printed; a candidate without a slash is
# looked up on PATH; empty ones are skipped. With `--if TEST`, only a candidate for which the
# function TEST succeeds. Exit status 1 when there is none.
first_executable() {
    local accept="" candidate
    if [[ "${1:-}" == "--if" ]]; then
        accept="$2"
        shift 2
    fi
    for candidate in "$@"; do
        [[ -z "${candidate}" ]] && continue
        if [[ "${candidate}" != */* ]]; then
            candidate="$(command -v "${candidate}" 2>/dev/null || true)"
            [[ -z "${candidate}" ]] && continue
        fi
        if [[ -f "${candidate}" && -x "${candidate}" ]] && { [[ -z "${accept}" ]] || "${accept}" "${candidate}"; }; then
            printf '%s\n' "${candidate}"
            return 0
        fi
    done
    return 1
}

# find_or_install FIND WHAT HELP PACKAGE...
#
#   1. FIND (a function printing what it found on stdout) succeeds: exit 0;
#   2. otherwise, when running as root on a machine with apt-get and ENSURE_LOOK_ONLY is not 1,
#      install PACKAGEs with apt-get (its output in $TMPDIR/celery-pq-apt-PACKAGE.log, one line on
#      stderr: scripts/quietly.sh), then FIND again;
#   3. otherwise print "error: WHAT not found; HELP" on stderr and exit 1.
find_or_install() {
    local find="$1" what="$2" help="$3"
    shift 3
    if "${find}"; then
        exit 0
    fi
    if [[ "${ENSURE_LOOK_ONLY:-0}" != 1 && "$(id -u)" -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        bash "$(dirname "${BASH_SOURCE[0]}")/quietly.sh" "${TMPDIR:-/tmp}/celery-pq-apt-$1.log" \
            "${what} not found; installing $* with apt-get" \
            sh -c "apt-get update && apt-get install -y --no-install-recommends $*" || exit 1
        if "${find}"; then
            exit 0
        fi
        echo "error: apt-get install $* finished but ${what} is still missing" >&2
        exit 1
    fi
    echo "error: ${what} not found; ${help}" >&2
    exit 1
}
