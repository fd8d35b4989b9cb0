#!/bin/bash
# nfsd-start.sh (guest) - kernel nfsd exporting /export (tmpfs) on TCP 2049 and RDMA 20049 (siw0
# on eth0), with rpc.mountd pinned to port 20048 so a peer can mount without the portmapper.
set -e
/mnt/host/bin/siw-load.sh stock >/dev/null
modprobe nfsd; modprobe rpcrdma
mountpoint -q /export || mount -t tmpfs -o size=1g tmpfs /export
mountpoint -q /proc/fs/nfsd || mount -t nfsd nfsd /proc/fs/nfsd
mountpoint -q /var/lib/nfs/rpc_pipefs || mount -t rpc_pipefs rpc_pipefs /var/lib/nfs/rpc_pipefs
pgrep -x rpcbind >/dev/null || rpcbind -w
exportfs -ra
pgrep -x rpc.mountd >/dev/null || rpc.mountd -p 20048
# GRACE (seconds, >= 10): a shorter NFSv4 grace period than the default lease, for callers that
# open files at once (pynfs); it must be set before nfsd starts.
if [ -n "${GRACE:-}" ] && ! pgrep -x nfsd >/dev/null; then echo "$GRACE" > /proc/fs/nfsd/nfsv4gracetime; fi
pgrep -x nfsd >/dev/null || rpc.nfsd 4
grep -q '^rdma 20049' /proc/fs/nfsd/portlist || echo "rdma 20049" > /proc/fs/nfsd/portlist
echo "nfsd portlist: $(tr '\n' ' ' < /proc/fs/nfsd/portlist)"
