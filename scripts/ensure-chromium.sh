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
source "$(dirname "${BASH_SOURCE[0]}")/ensure-lib.sh"

if [[ "${1:-}" == "--check" ]]; then
    ENSURE_LOOK_ONLY=1
fi

find_both() {
    local browser driver
    browser="$(first_executable "${PQ_CHROMIUM:-}" chromium chromium-browser /usr/bin/chromium \
        /usr/lib/chromium/chromium)" || return 1
    driver="$(first_executable "${PQ_CHROMEDRIVER:-}" chromedriver /usr/bin/chromedriver \
        /usr/lib/chromium/chromedriver)" || return 1
    printf 'CHROMIUM=%s\nCHROMEDRIVER=%s\n' "${browser}" "${driver}"
}

find_or_install find_both "Chromium or its chromedriver (the dashboard's browser test needs both)" \
    "install them with: apt-get install chromium chromium-driver (Debian/Ubuntu, as root), or set PQ_CHROMIUM and PQ_CHROMEDRIVER to their paths" \
    chromium chromium-driver
