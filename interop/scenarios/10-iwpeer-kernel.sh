#!/bin/bash
# iwpeer (C, librdmacm) <-> kernel siw inside the guest: validates the C peer itself and records
# what kernel siw puts on the wire (stock, CRC, P2P/RTR, CRC+P2P) as captures for WIRE-NOTES.md.
# limit: 420
# ci: yes
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
