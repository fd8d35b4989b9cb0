#!/bin/bash
# build-siw-variants.sh RECIPE_DIR DEST_DIR
# Build kernel siw.ko variants whose compile-time MPA policy differs from the stock module,
# so the lab can make kernel siw *initiate* with CRC and/or peer-to-peer RTR.  In Linux 6.1
# these are `const bool` in drivers/infiniband/sw/siw/siw_main.c, not module parameters:
#   mpa_crc_required  (stock false) - ask for CRC in the MPA Request, insist on it in the Reply
#   peer_to_peer      (stock false) - ask for P2P mode (RTR) in the MPA v2 Request
# Variants: DEST_DIR/{crc,p2p,crc-p2p}/siw.ko.  Inputs are the kernel .debs that vmlab's
# build.sh left in RECIPE_DIR/dl (headers, kbuild, linux-source).  Idempotent.
set -euo pipefail
R=$(cd "$1" && pwd); D=$2
mkdir -p "$D"
img=$(ls "$R"/dl/linux-image-*-amd64_*_amd64.deb 2>/dev/null | grep -v dbg | head -1)
[ -n "$img" ] || { echo "no kernel .debs in $R/dl (run vmlab build.sh first)" >&2; exit 1; }
base=$(basename "$img"); KVER=${base#linux-image-}; KVER=${KVER%%_*}; KDEBVER=${base#*_}; KDEBVER=${KDEBVER%_*}
KS=${KVER%%.0-*}
stamp="$D/.built-$KVER-$KDEBVER"
[ -e "$stamp" ] && [ -e "$D/crc-p2p/siw.ko" ] && { echo "siw variants for $KVER up to date"; exit 0; }
W=$(mktemp -d /tmp/siwvar.XXXXXX); trap 'rm -rf "$W"' EXIT
for p in "linux-headers-$KVER" "linux-headers-${KVER%-amd64}-common" "linux-kbuild-$KS"; do
    dpkg-deb -x "$R/dl/${p}_${KDEBVER}_"*.deb "$W/hdr"
done
HDR=$W/hdr/usr/src/linux-headers-$KVER
sed -i "s#^include /usr/src/#include $W/hdr/usr/src/#" "$HDR/Makefile"
mkdir -p "$W/src"
dpkg-deb --fsys-tarfile "$R/dl/linux-source-${KS}_${KDEBVER}_all.deb" |
    tar -xO "./usr/src/linux-source-$KS.tar.xz" |
    tar -xJ -C "$W/src" --strip-components=4 "linux-source-$KS/drivers/infiniband/sw/siw"
for v in crc p2p crc-p2p; do
    rm -rf "$W/$v"; cp -a "$W/src/siw" "$W/$v"
    case $v in *crc*) sed -i 's/^const bool mpa_crc_required;/const bool mpa_crc_required = true;/' "$W/$v/siw_main.c" ;; esac
    case $v in *p2p*) sed -i 's/^const bool peer_to_peer;/const bool peer_to_peer = true;/' "$W/$v/siw_main.c" ;; esac
    grep -qE '^const bool (mpa_crc_required|peer_to_peer) = true;' "$W/$v/siw_main.c" ||
        { echo "siw_main.c did not take the $v edit (source changed?)" >&2; exit 1; }
    make -s -C "$HDR" M="$W/$v" CONFIG_RDMA_SIW=m -j"$(nproc)" modules 2>&1 | grep -v 'Skipping BTF' || true
    strip --strip-debug "$W/$v/siw.ko"
    mkdir -p "$D/$v"; cp "$W/$v/siw.ko" "$D/$v/siw.ko"
    echo "built $D/$v/siw.ko"
done
rm -f "$D"/.built-*; touch "$stamp"
