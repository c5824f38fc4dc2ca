#!/usr/bin/env bash
# Print the path of a redis-server binary on stdout (and nothing else).
#
#   1. $PQ_REDIS_SERVER, if it names an executable;
#   2. redis-server on PATH (or in /usr/sbin, /usr/local/bin);
#   3. otherwise, when running as root on a machine with apt-get, install the
#      Debian/Ubuntu package redis-server (progress goes to stderr);
#   4. otherwise explain what is missing and exit 1.
#
# The tests never use a system Redis: they start their own redis-server
# processes on free ports, so only the binary is needed.
set -euo pipefail

find_binary() {
    if [[ -n "${PQ_REDIS_SERVER:-}" && -x "${PQ_REDIS_SERVER}" ]]; then
        printf '%s\n' "${PQ_REDIS_SERVER}"
        return 0
    fi
    local found
    if found="$(command -v redis-server 2>/dev/null)"; then
        printf '%s\n' "${found}"
        return 0
    fi
    local candidate
    for candidate in /usr/bin/redis-server /usr/sbin/redis-server /usr/local/bin/redis-server \
                     /opt/homebrew/bin/redis-server; do
        if [[ -x "${candidate}" ]]; then
            printf '%s\n' "${candidate}"
            return 0
        fi
    done
    return 1
}

if find_binary; then
    exit 0
fi

if [[ "$(id -u)" -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    bash "$(dirname "${BASH_SOURCE[0]}")/quietly.sh" "${TMPDIR:-/tmp}/celery-pq-apt-redis.log" \
        "redis-server not found; installing it with apt-get" \
        sh -c 'apt-get update && apt-get install -y redis-server' || exit 1
    if find_binary; then
        exit 0
    fi
    echo "error: apt-get install redis-server finished but no redis-server binary was found" >&2
    exit 1
fi

echo "error: redis-server not found; install it with: apt-get install redis-server (Debian/Ubuntu) or brew install redis" >&2
exit 1
