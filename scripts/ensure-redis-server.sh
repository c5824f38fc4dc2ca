#!/usr/bin/env bash
# Print the path of a redis-server binary on stdout (and nothing else).
#
#   1. $PQ_REDIS_SERVER, if it names an executable;
#   2. redis-server on PATH (or in /usr/bin, /usr/sbin, /usr/local/bin, /opt/homebrew/bin);
#   3. otherwise, when running as root on a machine with apt-get, install the
#      Debian/Ubuntu package redis-server (progress goes to stderr);
#   4. otherwise explain what is missing and exit 1.
#
# The tests never use a system Redis: they start their own redis-server
# processes on free ports, so only the binary is needed.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/ensure-lib.sh"

find_redis_server() {
    first_executable "${PQ_REDIS_SERVER:-}" redis-server /usr/bin/redis-server /usr/sbin/redis-server \
        /usr/local/bin/redis-server /opt/homebrew/bin/redis-server
}

find_or_install find_redis_server redis-server \
    "install it with: apt-get install redis-server (Debian/Ubuntu) or brew install redis" redis-server
