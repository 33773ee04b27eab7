#!/usr/bin/env bash
# Packs what tests/device/run.sh needs on a GPU machine that cannot build
# lockstep (no network, no Debian packages: no gRPC, protobuf, spdlog...):
# the lockstep built here, the shared libraries it takes from Debian (not
# LibTorch's, not CUDA's, not the C and C++ runtimes: those are the GPU
# machine's), and Fashion-MNIST. Stripped, it stays well under the 64 MiB a
# device call carries.   Usage: tests/device/pack.sh [BUILD_DIR] [OUT_DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build}
out=${2:-$here/../../build-device}
[ -x "$build/lockstep" ] || { echo "pack.sh: no $build/lockstep: build first (README command 2)" >&2; exit 2; }
rm -rf "$out"
mkdir -p "$out/lib" "$out/data"
cp "$build/lockstep" "$out/"
ldd "$build/lockstep" | awk '/=> \// {print $3}' | while read -r lib; do
  case "$lib" in
    */site-packages/*|*/cuda/*|*/libc.so*|*/libm.so*|*/ld-linux*|*/libpthread.so*|*/libdl.so*|*/librt.so*|*/libutil.so*|*/libstdc++.so*|*/libgcc_s.so*) ;;
    *) cp -L "$lib" "$out/lib/" ;;
  esac
done
strip --strip-unneeded "$out/lockstep" "$out"/lib/*.so* 2>/dev/null || true
cp /usr/share/datasets/fashion-mnist/*-ubyte.gz "$out/data/"
{
  echo "lockstep $(git -C "$here/../.." rev-parse --short HEAD 2>/dev/null || echo unknown), packed $(date -u +%FT%TZ)"
  echo "built on: $(. /etc/os-release; echo "$PRETTY_NAME"), glibc $(ldd --version | head -1 | awk '{print $NF}')"
  echo "needs at most: $(objdump -T "$out/lockstep" "$out"/lib/*.so* 2>/dev/null | grep -o 'GLIBC_2\.[0-9]*' | sort -t. -k2 -n -u | tail -1), $(objdump -T "$out/lockstep" "$out"/lib/*.so* 2>/dev/null | grep -o 'GLIBCXX_3\.4\.[0-9]*' | sort -t. -k3 -n -u | tail -1)"
} > "$out/PACKED"
cat "$out/PACKED" >&2
du -sh "$out" >&2
