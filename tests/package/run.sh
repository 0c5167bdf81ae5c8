#!/usr/bin/env bash
# Package test (ctest Package.InstallAndConsume): installs a flashspan build tree into a scratch
# prefix with `cmake --install`, then builds and runs two consumers against the installed tree
# only: C++ through find_package(flashspan) (tests/package/consumer), C through pkg-config.
#   bash tests/package/run.sh <flashspan build dir>
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$1" && pwd)
work="$build/package-test"
rm -rf "$work"
mkdir -p "$work"
prefix="$work/prefix"

cmake --install "$build" --prefix "$prefix" >"$work/install.log"
for f in include/flashspan/flashspan.h include/flashspan/flashspan.hpp; do
  test -f "$prefix/$f" || { echo "not installed: $f"; exit 1; }
done
libdir=$(dirname "$(find "$prefix" -name 'libflashspan.so' | head -1)")

echo "-- C++ consumer: find_package(flashspan)"
cmake -S "$here/consumer" -B "$work/cpp" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  >"$work/cpp-configure.log"
cmake --build "$work/cpp" >"$work/cpp-build.log"
"$work/cpp/flashspan_consumer"

echo "-- C consumer: pkg-config"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
test "$(pkg-config --modversion flashspan)" = "$("$work/cpp/flashspan_consumer" --version)"
# shellcheck disable=SC2046
cc -std=c11 -Wall -Wextra -Werror -o "$work/c_consumer" "$here/consumer/consumer.c" $(pkg-config --cflags --libs flashspan)
LD_LIBRARY_PATH="$libdir" "$work/c_consumer"
echo "package test passed"
