#!/usr/bin/env bash
# make gpu-deps: copies the build dependencies a bare GPU machine lacks (it has a compiler,
# CMake, Ninja and the CUDA toolkit, but no Debian -dev packages and no network) from this
# Debian 12 machine into .gpu-deps/, a prefix that tools/gpu-check.sh hands to CMake there.
# The folder travels with the working tree (it is ignored by git; carry it by name).
#
# Layout (a prefix, so the copied CMake configs find their files relative to themselves):
#   include/          eigen3/, catch2/, fmt/, jpeglib.h jconfig.h jmorecfg.h jerror.h, zlib.h zconf.h
#   lib/              libjpeg.so.62, libz.so.1 (real files: carrying need not keep symlinks),
#                     libjpeg.so and libz.so as symlinks for convenience
#   share/eigen3/cmake/  Eigen3's own config (relocatable: it computes its prefix)
#   lib/cmake/Catch2/    Catch2's config, Catch.cmake and CatchAddTests.cmake (include(Catch))
#   lib/cmake/fmt/       a config written here: fmt::fmt header-only (FMT_HEADER_ONLY), so
#                        no libfmt.so built against our libstdc++ has to load over there
set -euo pipefail

cd "$(dirname "$0")/.."
DEST=${GPU_DEPS:-$PWD/.gpu-deps}
ARCH_LIB=/usr/lib/x86_64-linux-gnu

need() {
  for f in "$@"; do
    [ -e "$f" ] || { echo "gpu-deps: $f is missing (run make deps, as root, first)" >&2; exit 1; }
  done
}
need /usr/include/eigen3/Eigen/Core /usr/share/eigen3/cmake/Eigen3Config.cmake \
  /usr/include/catch2/catch.hpp /usr/lib/cmake/Catch2/Catch2Config.cmake /usr/lib/cmake/Catch2/Catch.cmake \
  /usr/include/fmt/format.h /usr/include/fmt/format-inl.h "$ARCH_LIB/cmake/fmt/fmt-config-version.cmake" \
  /usr/include/jpeglib.h /usr/include/x86_64-linux-gnu/jconfig.h "$ARCH_LIB/libjpeg.so.62" \
  /usr/include/zlib.h /usr/include/zconf.h "$ARCH_LIB/libz.so.1"

rm -rf "$DEST"
mkdir -p "$DEST/include" "$DEST/lib/cmake/Catch2" "$DEST/lib/cmake/fmt" "$DEST/share/eigen3/cmake"

# Eigen 3.4: headers and config.
cp -r /usr/include/eigen3 "$DEST/include/"
cp /usr/share/eigen3/cmake/Eigen3Config.cmake /usr/share/eigen3/cmake/Eigen3ConfigVersion.cmake \
  /usr/share/eigen3/cmake/Eigen3Targets.cmake "$DEST/share/eigen3/cmake/"

# Catch2 2.13: the single header and the config. Catch2Targets-none.cmake is left out: it
# only locates libCatch2WithMain.a, which kiln does not use (tests/catch_main.cpp is ours).
cp -r /usr/include/catch2 "$DEST/include/"
for f in Catch2Config.cmake Catch2ConfigVersion.cmake Catch2Targets.cmake Catch.cmake CatchAddTests.cmake \
  ParseAndAddCatchTests.cmake; do
  cp "/usr/lib/cmake/Catch2/$f" "$DEST/lib/cmake/Catch2/"
done

# fmt 9: headers, Debian's version file, and a header-only config of our own.
cp -r /usr/include/fmt "$DEST/include/"
cp "$ARCH_LIB/cmake/fmt/fmt-config-version.cmake" "$DEST/lib/cmake/fmt/"
cat >"$DEST/lib/cmake/fmt/fmt-config.cmake" <<'EOF'
# Written by kiln's tools/gpu-deps.sh: fmt as a header-only library (FMT_HEADER_ONLY), so
# that the GPU machine needs no libfmt.so built against another libstdc++. Both target
# names of fmt's own config are defined; fmt::fmt is the one kiln links.
get_filename_component(_kiln_fmt_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET fmt::fmt)
  add_library(fmt::fmt INTERFACE IMPORTED)
  set_target_properties(fmt::fmt PROPERTIES
    INTERFACE_COMPILE_DEFINITIONS "FMT_HEADER_ONLY=1"
    INTERFACE_INCLUDE_DIRECTORIES "${_kiln_fmt_prefix}/include")
endif()
if(NOT TARGET fmt::fmt-header-only)
  add_library(fmt::fmt-header-only INTERFACE IMPORTED)
  set_target_properties(fmt::fmt-header-only PROPERTIES INTERFACE_LINK_LIBRARIES fmt::fmt)
endif()
unset(_kiln_fmt_prefix)
set(fmt_FOUND TRUE)
EOF

# libjpeg-turbo: headers (jconfig.h moves next to jpeglib.h, out of the multiarch folder)
# and the shared library under its soname.
cp /usr/include/jpeglib.h /usr/include/jmorecfg.h /usr/include/jerror.h /usr/include/x86_64-linux-gnu/jconfig.h \
  "$DEST/include/"
cp -L "$ARCH_LIB/libjpeg.so.62" "$DEST/lib/libjpeg.so.62"
ln -s libjpeg.so.62 "$DEST/lib/libjpeg.so"

# zlib: headers and the shared library under its soname.
cp /usr/include/zlib.h /usr/include/zconf.h "$DEST/include/"
cp -L "$ARCH_LIB/libz.so.1" "$DEST/lib/libz.so.1"
ln -s libz.so.1 "$DEST/lib/libz.so"

cat >"$DEST/README" <<EOF
kiln's GPU-check bundle, made by tools/gpu-deps.sh on $(date -u +%Y-%m-%d) from Debian packages:
$(dpkg-query -W -f='  ${Package} ${Version}\n' libeigen3-dev catch2 libfmt-dev libjpeg62-turbo-dev zlib1g-dev 2>/dev/null)
tools/gpu-check.sh passes it to CMake (fmt_DIR, Eigen3_DIR, Catch2_DIR, JPEG_*, ZLIB_*).
EOF

echo "gpu-deps: $(du -sh "$DEST" | cut -f1) in $DEST"
