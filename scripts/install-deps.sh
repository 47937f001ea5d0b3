#!/usr/bin/env bash
# Installs what deepinfer needs to build and test, and only what is missing:
#   - Debian packages (checked with dpkg; `apt-get update` runs only if something is missing),
#   - Python packages from requirements-dev.txt (checked by importing them).
# Idempotent: a second run installs nothing and prints one line. Runs as root, or through sudo.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
requirements="$repo_root/requirements-dev.txt"

apt_packages=(
  build-essential cmake ninja-build pkg-config
  libopenblas-dev nlohmann-json3-dev libcli11-dev libfmt-dev libgtest-dev libgmock-dev libpcre2-dev
  libboost-dev
)

log() { echo "install-deps: $*"; }
die() { echo "install-deps: error: $*" >&2; exit 1; }

# Runs a command as root: directly when we are root, else through sudo.
as_root() {
  if [[ $(id -u) -eq 0 ]]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    die "need root to run '$*' (not root, and sudo is not installed); install the packages by hand"
  fi
}

installed() { [[ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" == "installed" ]]; }

# ---- Debian packages ------------------------------------------------------------------------------
if command -v dpkg-query >/dev/null 2>&1; then
  want=("${apt_packages[@]}")
  command -v python3 >/dev/null 2>&1 || want+=(python3)
  if ! python3 -m pip --version >/dev/null 2>&1; then want+=(python3-pip); fi
  missing=()
  for p in "${want[@]}"; do installed "$p" || missing+=("$p"); done
  if ((${#missing[@]})); then
    log "installing Debian packages: ${missing[*]}"
    apt_log="$(mktemp)"
    export DEBIAN_FRONTEND=noninteractive
    if ! as_root apt-get update -qq >"$apt_log" 2>&1; then
      cat "$apt_log" >&2
      die "'apt-get update' failed (output above): check the network and /etc/apt/sources.list"
    fi
    if ! as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$apt_log" 2>&1; then
      tail -n 40 "$apt_log" >&2
      die "'apt-get install ${missing[*]}' failed (output above)"
    fi
    rm -f "$apt_log"
  fi
else
  log "warning: no dpkg (not Debian/Ubuntu); install by hand: ${apt_packages[*]}"
fi

# ---- Python packages ------------------------------------------------------------------------------
command -v python3 >/dev/null 2>&1 || die "python3 not found"
[[ -f "$requirements" ]] || die "$requirements not found"

pip_missing=()
while IFS= read -r line || [[ -n "$line" ]]; do
  req="${line%%#*}"                      # drop comments
  req="$(echo "$req" | tr -d '[:space:]')"
  [[ -n "$req" ]] || continue
  name="${req%%[<>=!~;[]*}"              # distribution name without version or markers
  module="$(echo "$name" | tr 'A-Z-' 'a-z_')"
  python3 -c "import $module" >/dev/null 2>&1 || pip_missing+=("$req")
done <"$requirements"

if ((${#pip_missing[@]})); then
  log "installing Python packages: ${pip_missing[*]}"
  pip_args=(install --quiet --disable-pip-version-check)
  # Debian's system Python is "externally managed" (PEP 668): allow installing into it anyway.
  if python3 -c 'import sys, sysconfig, os; sys.exit(0 if sys.prefix == sys.base_prefix and os.path.exists(os.path.join(sysconfig.get_paths()["stdlib"], "EXTERNALLY-MANAGED")) else 1)'; then
    pip_args+=(--break-system-packages)
  fi
  if [[ $(id -u) -eq 0 ]]; then
    pip_args+=(--root-user-action=ignore)
  else
    # Without root, a user install works for any Python (no sudo pip).
    python3 -c 'import sys; sys.exit(0 if sys.prefix != sys.base_prefix else 1)' || pip_args+=(--user)
  fi
  pip_log="$(mktemp)"
  if ! python3 -m pip "${pip_args[@]}" "${pip_missing[@]}" >"$pip_log" 2>&1; then
    tail -n 40 "$pip_log" >&2
    die "'pip install ${pip_missing[*]}' failed (output above)"
  fi
  rm -f "$pip_log"
  for req in "${pip_missing[@]}"; do
    module="$(echo "${req%%[<>=!~;[]*}" | tr 'A-Z-' 'a-z_')"
    python3 -c "import $module" >/dev/null 2>&1 || die "installed $req but 'import $module' still fails"
  done
fi

log "all dependencies present"
