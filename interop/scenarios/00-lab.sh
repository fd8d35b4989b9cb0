#!/bin/bash
# Lab sanity: the guest boots, siw/rxe/rdma_cm/nfsd/rpcrdma/rds_tcp load, siw0 binds to eth0.
# limit: 180
# ci: yes
. "$(dirname "$0")/../lib/common.sh"
log=$IX_SCN_OUT/guest.log
ix_guest "$log" -t 150 -- '
for m in siw rdma_ucm ib_uverbs iw_cm rpcrdma nfsd rds_tcp; do
    modprobe $m && echo "CELL modprobe/$m pass" || echo "CELL modprobe/$m fail modprobe failed"
done
rdma link add siw0 type siw netdev eth0 && ibv_devices | grep -q siw0 &&
    echo "CELL siw0-on-eth0 pass $(ibv_devinfo -d siw0 | grep -m1 transport | tr -s " ")" ||
    echo "CELL siw0-on-eth0 fail no verbs device"
uname -r
'
rc=$?
cells_from_log "$log"
grep -q '^VMLAB_EXIT=' "$log" && cell boot pass "guest booted, $(grep -o 'uptime [0-9.]*s' "$log" | tail -1)" ||
    cell boot fail "run.sh rc $rc: $(tail -2 "$log" | tr '\n' ' ')"
