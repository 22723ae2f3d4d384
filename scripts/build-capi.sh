#!/usr/bin/env bash
# Builds libnrt.so (SONAME libnrt.so.1) from crates/capi and the libnrt.so.1 -> libnrt.so
# link next to it; with --examples also compiles examples/c/*.c against include/.
#
#   scripts/build-capi.sh [--release] [--examples]
#
# Prints the library directory last, e.g. target/release. Link C programs with
#   gcc -Iinclude prog.c -L<dir> -lnrt -Wl,-rpath,<dir>
# (or set LD_LIBRARY_PATH=<dir>); Python: ctypes.CDLL("<dir>/libnrt.so.1").
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
profile=debug
cargo_flags=()
examples=0
for arg in "$@"; do
    case "$arg" in
        --release) profile=release; cargo_flags+=(--release) ;;
        --examples) examples=1 ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) echo "build-capi.sh: unknown argument $arg" >&2; exit 2 ;;
    esac
done

cd "$root"
cargo build -p nrt-capi ${cargo_flags[@]+"${cargo_flags[@]}"}
dir="${CARGO_TARGET_DIR:-$root/target}/$profile"
ln -sfn libnrt.so "$dir/libnrt.so.1"

if [ "$examples" = 1 ]; then
    mkdir -p "$dir/examples-c"
    for src in examples/c/*.c; do
        name=$(basename "$src" .c)
        gcc -std=gnu11 -O2 -g -Wall -Wextra -Werror -I include "$src" \
            -L "$dir" -lnrt -Wl,-rpath,"$dir" -o "$dir/examples-c/$name"
        echo "built $dir/examples-c/$name" >&2
    done
fi
echo "$dir"
