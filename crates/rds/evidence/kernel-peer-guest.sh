echo "guest: start"
modprobe rds_tcp && echo "guest: rds_tcp loaded"
vmlab-rds recv 10.0.2.15 4001 20 200 > /tmp/r.log 2>&1 &
RP=$!
i=0
while [ $i -lt 200 ]; do
  c=$(grep -c "rds recv [0-9]" /tmp/r.log)
  [ "$c" -ge 20 ] && break
  sleep 1; i=$((i+1))
done
echo "guest: waited $i s"
cat /tmp/r.log
vmlab-rds send 10.0.2.15 4002 10.0.2.2 4000 hello-from-kernel
echo "guest: send rc=$?"
sleep 3
cat /proc/net/rds/* 2>/dev/null | head -5
echo "guest: done"
