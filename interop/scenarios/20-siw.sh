#!/bin/bash
# oxrdma soft-iWARP <-> kernel siw, both directions, MPA v2 with/without CRC and P2P (RTR).
# limit: 900
# ci: yes
#
# Needs `oxrdma iwarp peer` (the iwpeer protocol of interop/README.md; override the
# subcommand words with OX_IWPEER_CMD).  Cells:
#   guest-to-host/{stock,crc,p2p,crc-p2p}: guest kernel siw (variant = what it asks for)
#       dials `oxrdma iwarp peer server 127.0.0.1:HP` on the host (guest sees 10.0.2.2);
#   host-to-guest/{plain,crc,rtr-write,rtr-read,crc-rtr}: `oxrdma iwarp peer client` dials
#       the guest's iwpeer server through the port forward -p FP:19872, asking for those.
# Each cell: send, sendinv, write, read driven by both ends, sizes IX_SIW_SIZES.
. "$(dirname "$0")/../lib/common.sh"
read -ra SUB <<<"${OX_IWPEER_CMD:-iwarp peer}"
SIZES=${IX_SIW_SIZES:-1 4093 65536 1048576}
G2H="stock crc p2p crc-p2p"
H2G="plain crc rtr-write rtr-read crc-rtr"
if ! ix_landed "${SUB[@]}"; then
    for v in $G2H; do cell "guest-to-host/$v" not-landed "oxrdma ${SUB[*]} missing"; done
    for m in $H2G; do cell "host-to-guest/$m" not-landed "oxrdma ${SUB[*]} missing"; done
    exit 0
fi
[ -x "$IX_SHARE/bin/iwpeer" ] || { cell "-" skip "iwpeer not built"; exit 0; }
[ -e "$IX_SHARE/siw/crc/siw.ko" ] || G2H="stock"
HP=${IX_SIW_HP:-20871} FP=${IX_SIW_FP:-20872}
pids=()
cleanup() { rm -f "$IX_SCN_OUT/.serving"; for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; ix_capture_stop; }
trap cleanup EXIT
ix_capture_start "$IX_SCN_OUT/siw-host-lo.pcap" "$HP" "$FP"
mkdir -p "$OXRDMA_PCAP_DIR"

# ---- A: kernel siw initiates, oxrdma responds on the host
touch "$IX_SCN_OUT/.serving"
( while [ -e "$IX_SCN_OUT/.serving" ]; do
      timeout 120 "$OXRDMA" "${SUB[@]}" server 127.0.0.1 "$HP" --size 1048576 >> "$IX_SCN_OUT/host-server.log" 2>&1
      echo "host server rc=$?" >> "$IX_SCN_OUT/host-server.log"; sleep 0.2
  done ) & pids+=($!)
log=$IX_SCN_OUT/guest-a.log
ix_guest "$log" -t 400 -d "$IX_SHARE" -f "$IX_HERE/guest/siw-dial-host.sh" \
    VARIANTS="$G2H" SIZES="$SIZES" ITERS=3 HPORT="$HP"
cells_from_log "$log"
rm -f "$IX_SCN_OUT/.serving"
grep -q '^CELL guest-to-host' "$log" || cell guest-to-host fail "guest run gave no results: $(tail -2 "$log" | tr '\n' ' ')"

# ---- B: oxrdma initiates, kernel siw responds in the guest
nsz=$(wc -w <<<"$SIZES"); nm=$(wc -w <<<"$H2G")
# A size that failed after connecting is run once more on a fresh connection, at most MAXRETRY
# times in all; the cell says so and keeps the first failure. Seen once, in a clean-clone CI run
# (TCG guest, 2026-11-23 19:08 UTC): kernel siw closed the connection, with no Terminate, on our
# third 1-byte RDMA Read of the first rtr-write connection; the three Read Requests differ only
# in their MSN (1, 2, 3), and the guest's iwpeer then spun until its 120 s alarm holding the
# listener, so every later connection was refused. Not reproduced in three CI-style runs since.
# iwpeer now ends at once when the connection goes away, and the guest prints its dmesg for a
# failed server.
MAXRETRY=${IX_SIW_MAXRETRY:-2} retries=0
log=$IX_SCN_OUT/guest-b.log
rm -f "$IX_SHARE/tmp/siw-host-done" "$IX_SHARE/tmp/siw-guest-listening"
ix_guest "$log" -t 420 -p "$FP:19872" -d "$IX_SHARE" -f "$IX_HERE/guest/siw-serve-host.sh" \
    COUNT=$((nsz * nm + MAXRETRY)) GPORT=19872 MAXSIZE=1048576 & gpid=$!
pids+=($gpid)
# Dial only once the guest listens: QEMU's user networking accepts a host connection while the
# guest is still booting and hands it to the guest much later. Our client has given up on it by
# then, and the stale connection occupies a guest server for its whole 120 s timeout. All later
# connections get an MPA Reject. Seen in run /tmp/ix-ci1, port 37378: dialled at 8.8 s, the
# MPA Reply came at 27.0 s and was answered with RST.
for _ in $(seq 240); do
    [ -e "$IX_SHARE/tmp/siw-guest-listening" ] && break; kill -0 $gpid 2>/dev/null || break; sleep 0.5
done
# dial SIZE: one run of our client against the guest's iwpeer server at SIZE with ${opt[@]}.
# hostfwd accepts before the guest listens, and the guest restarts its server between
# connections: the dial is retried, for up to 90 s until the first connection, then for 30 s
# (one attempt can take 10 s: the MPA Reply timer, when the previous guest server still holds
# its listener). Sets rc, connected (0/1) and why.
dial() {
    local sz=$1 t0=$SECONDS
    while :; do
        timeout 120 "$OXRDMA" "${SUB[@]}" client 127.0.0.1 "$FP" "${opt[@]}" --size "$sz" --iters 3 \
            --ops send,sendinv,write,read > "$IX_SCN_OUT/host-client.tmp" 2>&1
        rc=$?
        grep -q '^CONNECTED' "$IX_SCN_OUT/host-client.tmp" && { seen=1; break; }
        kill -0 $gpid 2>/dev/null || break
        if [ "${seen:-0}" = 1 ] || [ "${tried:-0}" = 1 ]; then [ $((SECONDS - t0)) -lt 30 ] || break
        else [ $((SECONDS - t0)) -lt 90 ] || break; fi
        sleep 1
    done
    { echo "---- $m size $sz rc=$rc"; cat "$IX_SCN_OUT/host-client.tmp"; } >> "$IX_SCN_OUT/host-client.log"
    tried=1
    connected=0; grep -q '^CONNECTED' "$IX_SCN_OUT/host-client.tmp" && connected=1
    why="size $sz rc $rc: $(grep -m1 FAIL "$IX_SCN_OUT/host-client.tmp")"
}
for m in $H2G; do
    case $m in
        plain) opt=() ;; crc) opt=(--crc) ;;
        rtr-write) opt=(--p2p --rtr write) ;; rtr-read) opt=(--p2p --rtr read) ;;
        crc-rtr) opt=(--crc --p2p --rtr write,read) ;;
    esac
    ok=1 note="" rnote=""
    for sz in $SIZES; do
        dial "$sz"
        if [ $rc != 0 ] && [ $connected = 1 ] && [ $retries -lt "$MAXRETRY" ]; then
            retries=$((retries + 1)); rnote+=" retried $why;"
            dial "$sz"
        fi
        [ $rc = 0 ] || { ok=0; note+=" $why"; }
        [ $connected = 1 ] || { note+=" (never connected; other sizes skipped)"; break; }
    done
    if [ $ok = 1 ]; then cell "host-to-guest/$m" pass "sizes $SIZES${rnote:+ (flaky:$rnote passed on a fresh connection)}"
    else cell "host-to-guest/$m" fail "$note${rnote:+ (also$rnote)}"; fi
done
touch "$IX_SHARE/tmp/siw-host-done"
wait $gpid
# the guest's own verdicts (its iwpeer server checks the data oxrdma wrote/sent/read)
# (a failed server that served an attempt the host retried is reported, not failed)
bad=$(grep -a '^SERVER ' "$log" | tr -d '\r' | grep -v 'rc=0')
nbad=$(grep -c . <<<"$bad")
if [ -n "$bad" ] && [ "$nbad" -gt "$retries" ]; then cell host-to-guest/guest-verdicts fail "$(head -2 <<<"$bad" | tr '\n' ' ')"
elif [ -n "$bad" ]; then
    cell host-to-guest/guest-verdicts pass "$(grep -ac '^SERVER ' "$log") guest-side iwpeer servers; PASS but the $nbad the host retried: $(tr '\n' ' ' <<<"$bad")"
elif grep -aq '^SERVER ' "$log"; then cell host-to-guest/guest-verdicts pass "$(grep -ac '^SERVER ' "$log") guest-side iwpeer servers all PASS"
else cell host-to-guest/guest-verdicts skip "no connection reached the guest"; fi
