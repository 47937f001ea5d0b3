#!/usr/bin/env bash
# Installs the Debian packages whose text tools/train/corpus.py reads, and `bible` (bible-kjv), the
# reader of the compressed KJV data; CORPUS.md lists their licences. Idempotent: installs only what
# is missing. Needs root or sudo (Debian 12).
set -euo pipefail
PKGS=(bible-kjv bible-kjv-text jargon-text wordnet-base python3.11-doc)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "corpus packages already installed: ${PKGS[*]}"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y --no-install-recommends "${missing[@]}"
