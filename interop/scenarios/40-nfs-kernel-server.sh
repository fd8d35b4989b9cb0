#!/bin/bash
# Host `oxrdma nfs client` -> kernel nfsd (guest) over RDMA (oxrdma iWARP <-> siw) and TCP.
# limit: 600
# ci: yes
#
# The guest runs nfsd with `rdma 20049` in its portlist (siw0 on eth0) and mountd on 20048;
# the host reaches them through port forwards: RDMA/TCP 127.0.0.1:$FR -> 20049,
# TCP 127.0.0.1:$FT -> 2049, MOUNT 127.0.0.1:$FM -> 20048, portmap 127.0.0.1:$FPM -> 111.
# Host command (OX_NFS_CLIENT_CMD overrides "nfs client"):
#   oxrdma nfs client --rdma 127.0.0.1:FR --mount-port FM --export /export selftest
#   oxrdma nfs client --tcp 127.0.0.1:FT --mount-port FM --export /export selftest
# "selftest" = the same round trips as guest/nfs-roundtrip.sh (create/write/read back/compare
# 0 B..64 MiB, readdir, mkdir, rename, symlink/readlink, remove); exit 0 = pass.
# Cell rdma/oxrdma-client-v2: the same selftest with `--rpcrdma-version auto` (RPC-over-RDMA
# version 2, draft-cel-05): the client probes in version 2, Linux nfsd (version 1 only) answers
# ERR_VERS [1,1], the client falls back on the same connection; pass = selftest passed and the
# client's log names the fallback.
# Cell kernel-baseline (guest kernel client -> guest nfsd over siw) runs regardless: it proves
# the server side of the lab.
. "$(dirname "$0")/../lib/common.sh"
read -ra SUB <<<"${OX_NFS_CLIENT_CMD:-nfs client}"
FR=${IX_NFSD_FR:-21049} FT=${IX_NFSD_FT:-21050} FM=${IX_NFSD_FM:-21048} FPM=${IX_NFSD_FPM:-21111}
landed=1; ix_landed "${SUB[@]}" || landed=0
rm -f "$IX_SHARE/tmp/nfs-guest-ready" "$IX_SHARE/tmp/nfs-host-done"
log=$IX_SCN_OUT/guest.log
wait_s=$([ $landed = 1 ] && echo 480 || echo 1)
trap 'touch "$IX_SHARE/tmp/nfs-host-done"; ix_capture_stop' EXIT
ix_capture_start "$IX_SCN_OUT/nfsd-host-lo.pcap" "$FR" "$FT" "$FM" "$FPM"
ix_guest "$log" -t $((IX_LIMIT - 30)) -d "$IX_SHARE" -p "$FR:20049" -p "$FT:2049" -p "$FM:20048" -p "$FPM:111" \
    -f "$IX_HERE/guest/nfsd-serve-host.sh" WAIT="$wait_s" BASELINE=1 MAXMB=16 & gpid=$!
if [ $landed = 1 ]; then
    for i in $(seq 120); do [ -e "$IX_SHARE/tmp/nfs-guest-ready" ] && break; kill -0 $gpid 2>/dev/null || break; sleep 1; done
    mkdir -p "$OXRDMA_PCAP_DIR"
    for t in rdma tcp; do
        case $t in rdma) ep=(--rdma "127.0.0.1:$FR") ;; tcp) ep=(--tcp "127.0.0.1:$FT") ;; esac
        timeout 300 "$OXRDMA" "${SUB[@]}" "${ep[@]}" --mount-port "$FM" --export /export selftest \
            > "$IX_SCN_OUT/client-$t.log" 2>&1
        rc=$?
        [ $rc = 0 ] && cell "$t/oxrdma-client" pass "selftest against kernel nfsd" ||
            cell "$t/oxrdma-client" fail "rc $rc: $(grep -m1 -iE 'fail|error' "$IX_SCN_OUT/client-$t.log")"
    done
    if timeout 10 "$OXRDMA" --help 2>&1 | grep -q -- --rpcrdma-version; then
        v2log=$IX_SCN_OUT/client-rdma-v2.log
        timeout 300 "$OXRDMA" -v --rpcrdma-version auto "${SUB[@]}" --rdma "127.0.0.1:$FR" \
            --mount-port "$FM" --export /export selftest > "$v2log" 2>&1
        rc=$?
        fb=$(grep -a -m1 -o 'version 1 negotiated: the server refused version 2[^"]*' "$v2log")
        if [ $rc = 0 ] && [ -n "$fb" ]; then
            cell rdma/oxrdma-client-v2 pass "probe, fallback ($fb), selftest bit-exact"
        elif [ $rc = 0 ]; then
            cell rdma/oxrdma-client-v2 fail "selftest passed but no fallback in the log"
        else
            cell rdma/oxrdma-client-v2 fail "rc $rc: $(grep -a -m1 -iE 'fail|error' "$v2log")"
        fi
    else
        cell rdma/oxrdma-client-v2 not-landed "oxrdma has no --rpcrdma-version"
    fi
else
    cell rdma/oxrdma-client not-landed "oxrdma ${SUB[*]} missing"
    cell tcp/oxrdma-client not-landed "oxrdma ${SUB[*]} missing"
    cell rdma/oxrdma-client-v2 not-landed "oxrdma ${SUB[*]} missing"
fi
touch "$IX_SHARE/tmp/nfs-host-done"
wait $gpid
cells_from_log "$log"
grep -q '^CELL kernel-baseline' "$log" || cell kernel-baseline fail "no result: $(tail -2 "$log" | tr '\n' ' ')"
