#!/usr/bin/env bash
# Install the Debian packages for a local one-node SLURM cluster with accounting
# (see slurm-local.sh). Installs only; configuration and start-up live in slurm-local.sh.
# Needs root (or sudo) on Debian/Ubuntu.
set -euo pipefail

PACKAGES=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server)

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=(sudo)
    else
        echo "slurm-install: needs root (or sudo) to run apt-get" >&2
        exit 1
    fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "slurm-install: apt-get not found; install ${PACKAGES[*]} with your package manager" >&2
    exit 1
fi

missing=()
for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
    echo "slurm-install: already installed: ${PACKAGES[*]}"
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
# Without systemd the package scripts may try to start services; a policy-rc.d that
# forbids it keeps the install quiet and leaves start-up to slurm-local.sh.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee "$policy" >/dev/null
    "${SUDO[@]}" chmod 755 "$policy"
    created_policy=1
fi
cleanup() { if [[ $created_policy -eq 1 ]]; then "${SUDO[@]}" rm -f "$policy"; fi; }
trap cleanup EXIT

"${SUDO[@]}" apt-get update -q
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "slurm-install: installed ${missing[*]}"
