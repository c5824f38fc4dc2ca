#!/usr/bin/env bash
# Print the path of a java binary (Java 17 or newer, as PySpark 4 needs) on stdout, and nothing else.
#
#   1. $JAVA_HOME/bin/java, if it is executable;
#   2. java on PATH (or /usr/lib/jvm/java-17-openjdk-*/bin/java);
#   3. otherwise, when running as root on a machine with apt-get, install the Debian/Ubuntu
#      package openjdk-17-jre-headless (progress goes to stderr);
#   4. otherwise explain what is missing and exit 1.
#
# Only the Spark tests (marked spark) and the Spark benchmark need Java.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/ensure-lib.sh"

version_ok() {  # java 17 or newer
    local major
    major="$("$1" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1)"
    [[ -n "${major}" && "${major}" -ge 17 ]]
}

find_java() {
    first_executable --if version_ok "${JAVA_HOME:+${JAVA_HOME}/bin/java}" java \
        /usr/lib/jvm/java-17-openjdk-*/bin/java
}

find_or_install find_java "Java 17 or newer (PySpark needs it)" \
    "install it with: apt-get install openjdk-17-jre-headless (Debian/Ubuntu), brew install openjdk@17 (macOS), or set JAVA_HOME to a Java 17 installation" \
    openjdk-17-jre-headless
