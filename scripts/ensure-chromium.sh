#!/usr/bin/env bash
# Make sure a Chromium browser and its chromedriver are there for the dashboard's browser test
# (tests/e2e/test_dashboard_browser.py). Prints their paths on stdout, one per line:
#
#   CHROMIUM=/usr/bin/chromium
#   CHROMEDRIVER=/usr/bin/chromedriver
#
#   1. $PQ_CHROMIUM / $PQ_CHROMEDRIVER, when they name executables;
#   2. chromium (or chromium-browser) and chromedriver on PATH or in /usr/bin, /usr/lib/chromium;
#   3. otherwise, when running as root on a machine with apt-get (and not with --check), install
#      the Debian packages chromium and chromium-driver (progress goes to stderr);
#   4. otherwise say what to install and exit 1.
#
# `--check` only looks (steps 1, 2 and 4): the browser test runs it to fail with this message.
set -euo pipefail

check_only=0
if [[ "${1:-}" == "--check" ]]; then
    check_only=1
fi

first_executable() {
    local candidate
    for candidate in "$@"; do
        [[ -z "${candidate}" ]] && continue
        if [[ "${candidate}" != */* ]]; then
            candidate="$(command -v "${candidate}" 2>/dev/null || true)"
            [[ -z "${candidate}" ]] && continue
        fi
        if [[ -x "${candidate}" ]]; then
            printf '%s\n' "${candidate}"
            return 0
        fi
    done
    return 1
}

find_both() {
    browser="$(first_executable "${PQ_CHROMIUM:-}" chromium chromium-browser /usr/bin/chromium \
        /usr/lib/chromium/chromium)" || return 1
    driver="$(first_executable "${PQ_CHROMEDRIVER:-}" chromedriver /usr/bin/chromedriver \
        /usr/lib/chromium/chromedriver)" || return 1
}

report() {
    printf 'CHROMIUM=%s\nCHROMEDRIVER=%s\n' "${browser}" "${driver}"
}

if find_both; then
    report
    exit 0
fi

if [[ "${check_only}" -eq 0 && "$(id -u)" -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    bash "$(dirname "${BASH_SOURCE[0]}")/quietly.sh" "${TMPDIR:-/tmp}/celery-pq-apt-chromium.log" \
        "chromium or chromedriver not found; installing chromium and chromium-driver with apt-get" \
        sh -c 'apt-get update && apt-get install -y --no-install-recommends chromium chromium-driver' || exit 1
    if find_both; then
        report
        exit 0
    fi
    echo "error: apt-get install chromium chromium-driver finished but chromium or chromedriver is still missing" >&2
    exit 1
fi

echo "error: the dashboard's browser test needs Chromium and its chromedriver:" \
     "install them with: apt-get install chromium chromium-driver (Debian/Ubuntu, as root)," \
     "or set PQ_CHROMIUM and PQ_CHROMEDRIVER to their paths" >&2
exit 1
