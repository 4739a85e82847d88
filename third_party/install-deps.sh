#!/usr/bin/env bash
# Installs the Debian packages kiln builds against, when they are missing.
# Run as root it uses apt-get; otherwise it names what to install and stops.
set -euo pipefail

# wordnet-base: WordNet 3.0's data files, the English text corpus and task of data/wordnet.h.
# openmpi-bin: mpirun, which `make test` uses to launch data-parallel ranks as users' clusters
# do (about 6 MB to download, 21 MB installed with its libraries; kiln links none of it).
packages=(cmake ninja-build g++ make libeigen3-dev libfmt-dev catch2 libopenblas-openmp-dev
  libjpeg62-turbo-dev zlib1g-dev libdnnl-dev libgloo-dev dataset-fashion-mnist wordnet-base openmpi-bin)
# Where clang 14 is installed, its libFuzzer and sanitizer runtimes (only recommended by
# clang-14, so often absent) let `make test` build and run the fuzz targets (tests/fuzz).
if dpkg-query -W -f='${Status}' clang-14 2>/dev/null | grep -q "install ok installed"; then
  packages+=(libclang-rt-14-dev)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "kiln: missing Debian packages: ${missing[*]}" >&2
  echo "kiln: install them with: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "kiln: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
