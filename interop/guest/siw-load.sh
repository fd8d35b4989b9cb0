#!/bin/bash
# siw-load.sh VARIANT [NETDEV]  (guest) - (re)load kernel siw and bind siw0 to NETDEV (eth0).
# VARIANT: stock | crc | p2p | crc-p2p.  The variants are siw.ko rebuilt by
# tools/build-siw-variants.sh with mpa_crc_required / peer_to_peer set (the shared dir's
# siw/VARIANT/siw.ko); they change only what kernel siw asks for when it *initiates*.
set -e
v=${1:-stock}; dev=${2:-eth0}
modprobe ib_uverbs; modprobe rdma_ucm; modprobe iw_cm
rdma link delete siw0 2>/dev/null || true
rmmod siw 2>/dev/null || true
if [ "$v" = stock ]; then
    modprobe siw
else
    ko=/mnt/host/siw/$v/siw.ko
    [ -r "$ko" ] || { echo "siw-load: no $ko" >&2; exit 3; }
    modprobe siw && rmmod siw        # pulls in the dependencies (ib_core, crc32c, ...)
    insmod "$ko"
fi
rdma link add siw0 type siw netdev "$dev"
