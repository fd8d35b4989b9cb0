#!/bin/bash
# Same-guest performance pairs: kernel siw ib_write_bw vs `oxrdma perf write`, kernel NFS client
# reading from kernel nfsd vs `oxrdma nfs serve`, kernel rds_tcp vs oxrdma RDS (8 KiB, 256 B).
# limit: 600
# ci: no
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
log=$IX_SCN_OUT/guest.log
ix_guest "$log" -t $((IX_LIMIT - 20)) -s 2 -d "$IX_SHARE" -f "$IX_HERE/guest/perf-guest.sh" \
    DUR="${IX_PERF_DUR:-5}" MB=64 RDS_N=${IX_RDS_PERF_N:-1000} OX_PERF=$lp OX_NFS=$ln OX_RDS=$lr
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
ratio ratio/nfs-read nfs.read.oxrdma nfs.read.kernel $ln "nfs serve"
ratio ratio/rds-8192 rds.8192.oxrdma rds.8192.kernel $lr "rds peer"
ratio ratio/rds-256 rds.256.oxrdma rds.256.kernel $lr "rds peer"
grep -q '^CELL ' "$log" || cell "-" fail "guest gave no results: $(tail -2 "$log" | tr '\n' ' ')"
