#!/bin/bash
# nfs4-client.sh (guest) - the kernel NFSv4.x client against SERVER (host oxrdma nfs serve):
# the nfs-roundtrip.sh matrix for vers=4.0, 4.1, 4.2 and no vers=, each over RDMA and TCP; then
# fcntl locks held by two client instances (two NFSv4 client IDs) on the same file.
# env: SERVER (10.0.2.2), RP (20049), TP (2049), MAXMB (64), WAIT (seconds a blocked lock may take
#      after the holder releases it, 60)
# prints the round trips' STEP lines and CELL lines.
SERVER=${SERVER:-10.0.2.2}; RP=${RP:-20049}; TP=${TP:-2049}; MAXMB=${MAXMB:-64}; WAIT=${WAIT:-60}
B=/mnt/host/bin
$B/siw-load.sh stock >/dev/null 2>&1 || true
modprobe nfs; modprobe nfsv4; modprobe rpcrdma 2>/dev/null

# ---- round trips: CELL OPTS WANT (the vers= the mount must end up with)
rt() {
    local c=$1 opts=$2 want=$3 out=/tmp/rt.out v
    echo "== $c: mount -o $opts"
    SERVER=$SERVER EXPORT=/ OPTS="$opts" CELL="$c" MAXMB="$MAXMB" SIW=0 bash $B/nfs-roundtrip.sh > $out 2>&1
    grep -v '^CELL ' $out
    v=$(sed -n 's/^STEP mount ok.* nfs4 .*[ ,]vers=\([0-9.]*\).*/\1/p' $out | head -1)
    if ! grep -q "^CELL $c pass" $out; then grep "^CELL $c " $out || echo "CELL $c fail no result"
    elif [ "$v" != "$want" ]; then echo "CELL $c fail mounted vers=${v:-?}, wanted $want"
    else echo "CELL $c pass vers=$v: $(sed -n "s|^CELL $c pass ||p" $out)"; fi
}
rt rdma/v4.0 "vers=4.0,proto=rdma,port=$RP" 4.0
rt tcp/v4.0 "vers=4.0,proto=tcp,port=$TP" 4.0
rt rdma/v4.1 "vers=4.1,proto=rdma,port=$RP" 4.1
rt tcp/v4.1 "vers=4.1,proto=tcp,port=$TP" 4.1
rt rdma/v4.2 "vers=4.2,proto=rdma,port=$RP" 4.2
rt tcp/v4.2 "vers=4.2,proto=tcp,port=$TP" 4.2
rt rdma/no-vers "proto=rdma,port=$RP" 4.2
rt tcp/no-vers "proto=tcp,port=$TP" 4.2

# ---- locks between two client instances.
# Linux shares one nfs_client (one client ID) between mounts of the same server address, port,
# protocol and minor version in a network namespace (nfs_match_client), and after EXCHANGE_ID
# merges a new nfs_client into an existing one with the same co_ownerid and client ID
# (nfs41_walk_client_list).  The co_ownerid is "Linux NFSv4.1 <nodename>", the nodename being
# the UTS name of the process that mounts (rpc_create).  So client A mounts over RDMA, and
# client B over TCP from another UTS namespace with another hostname: two nfs_clients, two
# co_ownerids, two client IDs at the server.
cat > /tmp/lockf.py <<'PY'
import errno, fcntl, os, sys, time
# lk.py hold PATH READY RELEASE | try PATH | wait PATH GOT RELEASE
mode, path = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
def wait_file(p, secs):
    end = time.time() + secs
    while not os.path.exists(p):
        if time.time() > end:
            print("timeout waiting for", p, flush=True); sys.exit(2)
        time.sleep(0.1)
if mode == "hold":
    fcntl.lockf(fd, fcntl.LOCK_EX)
    print("held", flush=True); open(sys.argv[3], "w").close()
    wait_file(sys.argv[4], 300)
    fcntl.lockf(fd, fcntl.LOCK_UN)
    print("released %.3f" % time.time(), flush=True)
elif mode == "try":
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        print("got", flush=True); fcntl.lockf(fd, fcntl.LOCK_UN)
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            print("busy", errno.errorcode[e.errno], flush=True)
        else:
            raise
elif mode == "wait":
    t0 = time.time(); print("waiting", flush=True)
    fcntl.lockf(fd, fcntl.LOCK_EX)
    print("got %.3f after %.1f s" % (time.time(), time.time() - t0), flush=True)
    open(sys.argv[3], "w").close()
    wait_file(sys.argv[4], 300)
    fcntl.lockf(fd, fcntl.LOCK_UN)
PY
LA=/mnt/la LB=/mnt/lb; mkdir -p $LA $LB; rm -f /tmp/lk.*
lockcells="lock/two-clients lock/setlk-conflict lock/setlkw-waits lock/setlkw-gets-on-release lock/setlk-after-release"
lockfail() { for c in $lockcells; do echo "CELL $c fail $1"; done; }
if ! timeout 90 mount -t nfs -o "vers=4.1,proto=rdma,port=$RP" "$SERVER:/" $LA 2>/tmp/la.err; then
    lockfail "client A (rdma) did not mount: $(head -1 /tmp/la.err)"; exit 0; fi
if ! timeout 90 unshare --uts sh -c "hostname ixlock-b && mount -t nfs -o vers=4.1,proto=tcp,port=$TP $SERVER:/ $LB" 2>/tmp/lb.err; then
    lockfail "client B (tcp, hostname ixlock-b) did not mount: $(head -1 /tmp/lb.err)"; umount $LA; exit 0; fi
echo "mounts:"; grep -E " ($LA|$LB) " /proc/mounts
echo "/proc/fs/nfsfs/servers:"; cat /proc/fs/nfsfs/servers
n=$(grep -c '^v4 ' /proc/fs/nfsfs/servers)
if [ "$n" -ge 2 ]; then echo "CELL lock/two-clients pass $n NFSv4 nfs_clients (A rdma hostname $(hostname), B tcp hostname ixlock-b)"
else echo "CELL lock/two-clients fail $n NFSv4 nfs_client(s) in /proc/fs/nfsfs/servers"; fi
lockcells=${lockcells#lock/two-clients }
F=ixlock.$$; head -c 4096 /dev/urandom > $LA/$F
# A holds an exclusive lock on the whole file
python3 /tmp/lockf.py hold $LA/$F /tmp/lk.ready /tmp/lk.release > /tmp/lk.a 2>&1 & a=$!
for i in $(seq 300); do [ -e /tmp/lk.ready ] && break; sleep 0.2; done
if [ ! -e /tmp/lk.ready ]; then lockfail "A never got its lock: $(tr '\n' ' ' < /tmp/lk.a)"; kill $a; umount $LA $LB; exit 0; fi
echo "A: $(cat /tmp/lk.a)"
# B, F_SETLK: must fail at once
r=$(timeout 60 python3 /tmp/lockf.py try $LB/$F 2>&1)
echo "B try: $r"
case $r in busy*) echo "CELL lock/setlk-conflict pass B's F_SETLK failed with $(cut -d' ' -f2 <<<"$r") while A holds the lock";;
           *) echo "CELL lock/setlk-conflict fail B's F_SETLK gave: $r";; esac
# B, F_SETLKW: must block while A holds the lock, and get it after A releases
python3 /tmp/lockf.py wait $LB/$F /tmp/lk.bgot /tmp/lk.brelease > /tmp/lk.b 2>&1 & b=$!
sleep 5
if [ -e /tmp/lk.bgot ]; then echo "CELL lock/setlkw-waits fail B got the lock while A held it: $(tr '\n' ' ' < /tmp/lk.b)"
else echo "CELL lock/setlkw-waits pass B's F_SETLKW still blocked after 5 s"; fi
touch /tmp/lk.release; wait $a
echo "A: $(tail -1 /tmp/lk.a)"
for i in $(seq $((WAIT * 5))); do [ -e /tmp/lk.bgot ] && break; sleep 0.2; done
if [ -e /tmp/lk.bgot ]; then
    rel=$(sed -n 's/^released //p' /tmp/lk.a); got=$(sed -n 's/^got \([0-9.]*\) .*/\1/p' /tmp/lk.b)
    echo "B: $(tr '\n' ' ' < /tmp/lk.b)"
    echo "CELL lock/setlkw-gets-on-release pass B got the lock $(python3 -c "print(round($got - $rel, 1))") s after A released it"
else echo "CELL lock/setlkw-gets-on-release fail B did not get the lock within ${WAIT}s of A's release: $(tr '\n' ' ' < /tmp/lk.b)"; fi
# while B holds it, A's F_SETLK fails; after B releases, A's succeeds
r1=$(timeout 60 python3 /tmp/lockf.py try $LA/$F 2>&1)
touch /tmp/lk.brelease; wait $b
r2=$(timeout 60 python3 /tmp/lockf.py try $LA/$F 2>&1)
echo "A try while B holds: $r1; after B released: $r2"
case "$r1/$r2" in busy*/got) echo "CELL lock/setlk-after-release pass A's F_SETLK: '$r1' while B held the lock, 'got' after B released";;
                  *) echo "CELL lock/setlk-after-release fail A's F_SETLK: '$r1' while B held, '$r2' after";; esac
rm -f $LA/$F; umount $LB; umount $LA
