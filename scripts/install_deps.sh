#!/usr/bin/env bash
# Installs what building and testing flashspan needs, pinned: Debian packages (compiler,
# CMake, Ninja, ccache, GoogleTest) and the Python packages of requirements-ci.txt.
# Needs root for apt-get (skipped when everything is already there). The CUDA toolkit
# (nvcc) is expected at /usr/local/cuda or on PATH; without it the build is CPU-only.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

apt_pkgs=(g++=4:12.2.0-3 cmake=3.25.1-1 ninja-build=1.11.1-2~deb12u1 ccache=4.8+really4.7.5-1
          libgtest-dev=1.12.1-0.2)
need_apt=0
for p in g++ cmake ninja-build ccache libgtest-dev; do
  dpkg -s "$p" >/dev/null 2>&1 || need_apt=1
done
if [ "$need_apt" = 1 ]; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${apt_pkgs[@]}" ||
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        g++ cmake ninja-build ccache libgtest-dev  # pinned version gone from the mirror: take the current one
  else
    echo "install_deps: missing Debian packages (g++ cmake ninja-build ccache libgtest-dev) and not root" >&2
  fi
fi

python3 -m pip install -q -r "$root/requirements-ci.txt"
