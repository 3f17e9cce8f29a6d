#!/usr/bin/env bash
# Renders every overlay of deploy/kubernetes (`kubectl kustomize`) and validates the output
# against the Kubernetes schemas (`kubernetes-validate --strict`, PyPI, pinned in setup.sh;
# the ServiceMonitor and KEDA ScaledObject have no schema there and are reported as such),
# then checks deploy/systemd/dedup-host.service with `systemd-analyze verify` and scores it with
# `systemd-analyze security`. A tool that is missing is skipped with a message saying so:
# kubectl comes from no registry these machines reach (install it, or a `kustomize` binary).
# With DEDUP_DEPLOY_CHECK_STRICT=1 (CI, where the tools are installed) a missing tool fails
# the check instead: a runner that lost one must not pass by checking nothing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# A step whose tool is missing: skipped, or under strict mode a failure.
skip() {
    if [ "${DEDUP_DEPLOY_CHECK_STRICT:-0}" = 1 ]; then
        echo "deploy_check: FAILED (DEDUP_DEPLOY_CHECK_STRICT=1): $1" >&2
        exit 1
    fi
    echo "deploy_check: SKIPPED $1" >&2
}

render=""
if command -v kubectl >/dev/null 2>&1; then
    render="kubectl kustomize"
elif command -v kustomize >/dev/null 2>&1; then
    render="kustomize build"
fi
if [ -z "$render" ]; then
    skip "rendering deploy/kubernetes: neither kubectl nor kustomize is installed"
else
    for overlay in "$root"/deploy/kubernetes/overlays/*/; do
        name=$(basename "$overlay")
        $render "$overlay" >"$out/$name.yaml" \
            || { echo "deploy_check: overlay \`$name\` does not render (above)" >&2; exit 1; }
        if command -v kubernetes-validate >/dev/null 2>&1; then
            kubernetes-validate --strict --quiet "$out/$name.yaml" \
                || { echo "deploy_check: overlay \`$name\` fails the Kubernetes schemas (above)" >&2; exit 1; }
        else
            skip "validating overlay \`$name\`: kubernetes-validate is not installed (pip install kubernetes-validate)"
        fi
        echo "deploy_check: overlay \`$name\` renders ($(grep -c '^kind:' "$out/$name.yaml") objects)"
    done
fi

if command -v systemd-analyze >/dev/null 2>&1; then
    # `verify` wants ExecStart's binary to exist: point it at the one just built.
    unit="$out/dedup-host.service"
    sed "s#/usr/local/bin/dedup-host#$root/target/release/dedup-host#" \
        "$root/deploy/systemd/dedup-host.service" >"$unit"
    systemd-analyze verify "$unit" \
        || { echo "deploy_check: deploy/systemd/dedup-host.service does not verify (above)" >&2; exit 1; }
    systemd-analyze security --offline=yes --threshold=30 "$unit" >"$out/security.txt" \
        || { cat "$out/security.txt" >&2; echo "deploy_check: the unit's exposure is above 3.0 of 10 (above)" >&2; exit 1; }
    echo "deploy_check: systemd unit verified, $(tail -1 "$out/security.txt")"
else
    skip "the systemd unit: systemd-analyze is not installed"
fi
