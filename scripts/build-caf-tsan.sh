#!/usr/bin/env bash
# CAF 0.17.6 built with ThreadSanitizer, for the tsan preset. Debian's libcaf-core is compiled
# without TSan, so TSan cannot see the synchronisation inside CAF's mailboxes and reports every
# message hand-off between actors as a data race. This builds the same release from Debian's own
# source archive (deb.debian.org, checked against the SHA-256 in bookworm's Sources index) with
# clang -fsanitize=thread against libstdc++, and installs it under a cache folder outside git.
# The tsan preset then finds it first (scripts/sanitize.sh passes CMAKE_PREFIX_PATH).
#
# usage: scripts/build-caf-tsan.sh [PREFIX]   (default: $SEGFLOW_CAF_TSAN or ~/.cache/segflow/caf-0.17.6-tsan)
# Prints the prefix on stdout. Takes about 10 minutes on 2 cores; a second run returns at once.
set -euo pipefail
prefix="${1:-${SEGFLOW_CAF_TSAN:-$HOME/.cache/segflow/caf-0.17.6-tsan}}"
if [[ -f $prefix/lib/libcaf_core.so && -f $prefix/include/caf/all.hpp ]]; then
  echo "$prefix"
  exit 0
fi
url=http://deb.debian.org/debian/pool/main/a/actor-framework/actor-framework_0.17.6.orig.tar.gz
sha256=e2bf5bd243f08bb7d8adde197cfe3e6d71314ed3378fe0692f8932f4c3b3928c  # bookworm Sources, 0.17.6-2.1
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
curl -sSfL --retry 3 -o "$work/caf.tar.gz" "$url"
echo "$sha256  $work/caf.tar.gz" | sha256sum -c --quiet - ||
  { echo "build-caf-tsan: $url does not match the SHA-256 Debian lists" >&2; exit 1; }
tar xzf "$work/caf.tar.gz" -C "$work"
src="$work/actor-framework-0.17.6"
# The one source fix Debian 12's libstdc++ needs: receive_buffer.hpp
# uses std::numeric_limits without including <limits>.
sed -i 's|^#include <memory>$|#include <limits>\n#include <memory>|' "$src/libcaf_io/caf/io/network/receive_buffer.hpp"
grep -q '^#include <limits>' "$src/libcaf_io/caf/io/network/receive_buffer.hpp"
# Only the libraries segflow links (core, io): no examples, tools, unit tests, OpenSSL, OpenCL or
# Python. CAF_NO_AUTO_LIBCPP keeps clang on libstdc++, as segflow and LibTorch use.
cmake -S "$src" -B "$work/build" -G Ninja \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
  -DCMAKE_CXX_FLAGS="-fsanitize=thread" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" \
  -DCMAKE_INSTALL_PREFIX="$prefix.partial" \
  -DCAF_NO_AUTO_LIBCPP=yes -DCAF_NO_EXAMPLES=yes -DCAF_NO_UNIT_TESTS=yes -DCAF_NO_TOOLS=yes \
  -DCAF_NO_OPENSSL=yes -DCAF_NO_OPENCL=yes -DCAF_NO_PYTHON=yes -DCAF_NO_SUMMARY=yes \
  -DCAF_NO_COMPILER_CHECK=yes > "$work/configure.log" 2>&1 || { tail -30 "$work/configure.log" >&2; exit 1; }
ninja -C "$work/build" -j"$(nproc)" install > "$work/build.log" 2>&1 || { tail -40 "$work/build.log" >&2; exit 1; }
rm -rf "$prefix"
mv "$prefix.partial" "$prefix"
echo "$prefix"
