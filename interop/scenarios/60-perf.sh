#!/bin/bash
# Same-guest performance pairs: kernel siw ib_write_bw vs `oxrdma perf write`; the kernel NFS
# client over siw against kernel nfsd vs `oxrdma nfs serve` (64 MiB write, 64 MiB cold read,
# small files: create, stat, remove); kernel rds_tcp vs oxrdma RDS (8 KiB, 256 B).  And across
# QEMU's user network: `oxrdma rpc bench` in the guest against `oxrdma rpc serve-null` on the
# host, RPC-over-RDMA (oxrdma's soft-iWARP at both ends) vs ONC RPC over TCP, depths 1 and 16.
# limit: 1200
# ci: no
#
# Environment: IX_PERF_DUR (5, ib_write_bw seconds), IX_RDS_PERF_N (1000), IX_PERF_FILES (2000,
# small-file count), IX_RPC_DUR (10, rpc bench seconds per transport and depth), IX_RPC_TCP_HP
# (20881) and IX_RPC_RDMA_HP (20882), the host ports of `rpc serve-null`.
#
# Only figures measured inside the same guest in one run are compared (TCG; see vmlab README).
# The oxrdma binary runs inside the guest (shared at /mnt/host/bin/oxrdma): it must run on
# Debian 12 (glibc 2.36), which a binary built on this host does.  Results: perf.tsv, ratios
# oxrdma/kernel in the cells.
. "$(dirname "$0")/../lib/common.sh"
lp=0 ln=0 lr=0
ix_landed perf && lp=1
ix_landed nfs serve && ln=1
ix_landed rds peer && lr=1
lrpc=0
ix_landed rpc bench && ix_landed rpc serve-null && lrpc=1
# The host's NULL server for the guest's rpc bench: the guest reaches the host's 127.0.0.1 as
# 10.0.2.2 through QEMU's user network (slirp), so every call crosses the guest's TCP stack,
# QEMU's and the host's.
RPC_TCP_HP=${IX_RPC_TCP_HP:-20881} RPC_RDMA_HP=${IX_RPC_RDMA_HP:-20882} rpc_tcp= rpc_rdma= spid=
if [ $lrpc = 1 ]; then
    # Uncaptured, like the rest of this scenario (a capture would slow what it measures).
    env -u OXRDMA_PCAP_DIR "$OXRDMA" rpc serve-null --tcp 127.0.0.1:$RPC_TCP_HP --rdma 127.0.0.1:$RPC_RDMA_HP > "$IX_SCN_OUT/serve-null.log" 2>&1 & spid=$!
    trap '[ -n "$spid" ] && kill $spid 2>/dev/null' EXIT; trap 'exit 143' TERM
    for _ in $(seq 50); do [ "$(grep -c '^listening' "$IX_SCN_OUT/serve-null.log")" -ge 2 ] && break; sleep 0.2; done
    if [ "$(grep -c '^listening' "$IX_SCN_OUT/serve-null.log")" -ge 2 ]; then rpc_tcp=10.0.2.2:$RPC_TCP_HP rpc_rdma=10.0.2.2:$RPC_RDMA_HP
    else cell rpc/serve-null fail "the host's rpc serve-null did not listen: $(tail -2 "$IX_SCN_OUT/serve-null.log" | tr '\n' ' ')"; fi
fi
log=$IX_SCN_OUT/guest.log
ix_guest "$log" -t $((IX_LIMIT - 20)) -s 2 -d "$IX_SHARE" -f "$IX_HERE/guest/perf-guest.sh" \
    DUR="${IX_PERF_DUR:-5}" MB=64 RDS_N=${IX_RDS_PERF_N:-1000} FILES=${IX_PERF_FILES:-2000} \
    OX_PERF=$lp OX_NFS=$ln OX_RDS=$lr OX_RPC=$lrpc RPC_TCP=$rpc_tcp RPC_RDMA=$rpc_rdma RPC_DUR=${IX_RPC_DUR:-10}
if [ -n "$spid" ]; then kill $spid 2>/dev/null; wait $spid 2>/dev/null; spid=; fi
cells_from_log "$log"
grep -a '^PERF ' "$log" | tr -d '\r' | cut -d' ' -f2- | tr ' ' '\t' > "$IX_SCN_OUT/perf.tsv"
val() { awk -F'\t' -v k="$1" '$1==k {print $2}' "$IX_SCN_OUT/perf.tsv"; }
ratio() {  # ratio CELL KEY_OX KEY_KERNEL LANDED WHAT
    if [ "$4" = 0 ]; then cell "$1" not-landed "oxrdma $5 missing"; return; fi
    local o k; o=$(val "$2"); k=$(val "$3")
    if [ -n "$o" ] && [ -n "$k" ]; then cell "$1" pass "oxrdma/kernel = $(awk -v o="$o" -v k="$k" 'BEGIN{printf "%.2f", (k>0)?o/k:0}') ($o vs $k)"
    else cell "$1" skip "a figure is missing (oxrdma '$o', kernel '$k')"; fi
}
ratio ratio/write-bw siw.write_bw.oxrdma siw.write_bw.kernel $lp "perf"
# NFS: oxrdma ÷ kernel nfsd, MB/s or ops/s (> 1: oxrdma is faster)
ratio ratio/nfs-write nfs.write.oxrdma nfs.write.kernel $ln "nfs serve"
ratio ratio/nfs-read nfs.read.oxrdma nfs.read.kernel $ln "nfs serve"
for ph in total create stat remove; do
    ratio ratio/nfs-small-$ph nfs.small.$ph.oxrdma nfs.small.$ph.kernel $ln "nfs serve"
done
ratio ratio/rds-8192 rds.8192.oxrdma rds.8192.kernel $lr "rds peer"
ratio ratio/rds-256 rds.256.oxrdma rds.256.kernel $lr "rds peer"
# rpc bench across QEMU's network: RDMA ÷ TCP, calls/s (target >= 1) and p99 latency (target <= 1)
rratio() {  # rratio CELL KEY_RDMA KEY_TCP WHAT
    if [ $lrpc = 0 ]; then cell "$1" not-landed "oxrdma rpc bench / rpc serve-null missing"; return; fi
    local a b; a=$(val "$2"); b=$(val "$3")
    if [ -n "$a" ] && [ -n "$b" ]; then cell "$1" pass "$4 RDMA/TCP = $(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.2f", (b>0)?a/b:0}') ($a vs $b)"
    else cell "$1" skip "a figure is missing (RDMA '$a', TCP '$b')"; fi
}
for d in 1 16; do
    rratio ratio/rpc-d$d-calls rpc.d$d.rdma.cps rpc.d$d.tcp.cps "calls/s"
    rratio ratio/rpc-d$d-p99 rpc.d$d.rdma.p99 rpc.d$d.tcp.p99 "p99 µs"
done
grep -q '^CELL ' "$log" || cell "-" fail "guest gave no results: $(tail -2 "$log" | tr '\n' ' ')"
