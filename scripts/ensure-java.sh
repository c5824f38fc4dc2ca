#!/usr/bin/env bash
# Print the path of a java binary (Java 17 or newer, as PySpark 4 needs) on stdout, and nothing else.
#
#   1. $JAVA_HOME/bin/java, if it is executable;
#   2. java on PATH;
#   3. otherwise, when running as root on a machine with apt-get, install the Debian/Ubuntu
#      package openjdk-17-jre-headless (progress goes to stderr);
#   4. otherwise explain what is missing and exit 1.
#
# Only the Spark tests (marked spark) and the Spark benchmark need Java.
set -euo pipefail

version_ok() {  # java 17 or newer
    local major
    major="$("$1" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1)"
    [[ -n "${major}" && "${major}" -ge 17 ]]
}

find_java() {
    local candidate
    for candidate in "${JAVA_HOME:+${JAVA_HOME}/bin/java}" "$(command -v java 2>/dev/null || true)" \
                     /usr/lib/jvm/java-17-openjdk-*/bin/java; do
        if [[ -n "${candidate}" && -x "${candidate}" ]] && version_ok "${candidate}"; then
            printf '%s\n' "${candidate}"
            return 0
        fi
    done
    return 1
}

if find_java; then
    exit 0
fi

if [[ "$(id -u)" -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    bash "$(dirname "${BASH_SOURCE[0]}")/quietly.sh" "${TMPDIR:-/tmp}/celery-pq-apt-java.log" \
        "Java 17 not found (PySpark needs it); installing openjdk-17-jre-headless with apt-get" \
        sh -c 'apt-get update && apt-get install -y openjdk-17-jre-headless' || exit 1
    if find_java; then
        exit 0
    fi
    echo "error: apt-get install openjdk-17-jre-headless finished but no java 17 binary was found" >&2
    exit 1
fi

echo "error: Java 17 or newer not found (PySpark needs it); install it with:" \
     "apt-get install openjdk-17-jre-headless (Debian/Ubuntu), brew install openjdk@17 (macOS)," \
     "or set JAVA_HOME to a Java 17 installation" >&2
exit 1
