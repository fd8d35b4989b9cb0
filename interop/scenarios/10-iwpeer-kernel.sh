#!/bin/bash
# iwpeer (C, librdmacm) <-> kernel siw inside the guest: validates the C peer itself and records
# what kernel siw puts on the wire (stock, CRC, P2P/RTR, CRC+P2P) as captures for WIRE-NOTES.md.
# limit: 600
# ci: no (kernel siw against kernel siw: its cells check the lab, never oxrdma, and cannot fail CI; its ~4 min go to the NFS scenarios instead)
. "$(dirname "$0")/../lib/common.sh"
[ -x "$IX_SHARE/bin/iwpeer" ] || { cell "-" skip "iwpeer not built (needs gcc + librdmacm-dev/libibverbs-dev)"; exit 0; }
vars="stock"
[ -e "$IX_SHARE/siw/crc/siw.ko" ] && vars="stock crc p2p crc-p2p"
log=$IX_SCN_OUT/guest.log
rm -f "$IX_SHARE"/cap/siw-*.pcap
ix_guest "$log" -t $((IX_LIMIT - 20)) -d "$IX_SHARE" -f "$IX_HERE/guest/iwpeer-selftest.sh" \
    VARIANTS="$vars" SIZES="${IX_SIW_SIZES:-1 4093 65536 1048576}" ITERS=3 PORT=19871
rc=$?
cells_from_log "$log"
for v in $vars; do
    f=$IX_SHARE/cap/siw-$v.pcap
    [ -s "$f" ] || continue
    mv "$f" "$IX_SCN_OUT/"
    python3 "$IX_HERE/tools/mpa-dump.py" "$IX_SCN_OUT/siw-$v.pcap" > "$IX_SCN_OUT/siw-$v.mpa.txt" 2>&1
done
grep -q '^CELL ' "$log" || cell "-" fail "guest run rc $rc, no results: $(tail -3 "$log" | tr '\n' ' ')"

# Same peers, but routed through the host (guest -> 10.0.2.2:HP -> tools/tcp-relay.py ->
# 127.0.0.1:FP -> hostfwd -> guest): the host loopback capture shows kernel siw's FPDUs as they
# cross the QEMU user network (guest MSS 1460), i.e. what oxrdma on the host will receive.
HP=${IX_RELAY_HP:-20873} FP=${IX_RELAY_FP:-20874}
python3 "$IX_HERE/tools/tcp-relay.py" "$HP" "$FP" 300 > "$IX_SCN_OUT/relay.log" 2>&1 & relay=$!
ix_capture_start "$IX_SCN_OUT/siw-via-host.pcap" "$HP"
vh="stock"; [ -e "$IX_SHARE/siw/crc/siw.ko" ] && vh="stock crc"
log2=$IX_SCN_OUT/guest-via-host.log
ix_guest "$log2" -t 240 -p "$FP:19873" -d "$IX_SHARE" -f "$IX_HERE/guest/iwpeer-via-host.sh" \
    VARIANTS="$vh" SIZES="1 65536" HPORT="$HP" GPORT=19873
ix_capture_stop; kill $relay 2>/dev/null
cells_from_log "$log2"
grep -q '^CELL ' "$log2" || cell kernel-via-host fail "no result: $(tail -2 "$log2" | tr '\n' ' ')"
[ -s "$IX_SCN_OUT/siw-via-host.pcap" ] && python3 "$IX_HERE/tools/mpa-dump.py" "$IX_SCN_OUT/siw-via-host.pcap" "$HP" > "$IX_SCN_OUT/siw-via-host.mpa.txt" 2>&1
