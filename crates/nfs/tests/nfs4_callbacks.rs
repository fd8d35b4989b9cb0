//! NFSv4.1 callbacks end to end, over TCP and over RPC-over-RDMA (soft-iWARP on loopback):
//! the CB_NULL probe of the back channel after CREATE_SESSION and what SEQUENCE reports of
//! it (SEQ4_STATUS_CB_PATH_DOWN), and CB_NOTIFY_LOCK to a client whose blocking LOCK was
//! denied once the conflicting lock is released. The client side answers the callbacks with
//! `nfs::nfs4::callback::program::CallbackProgram` on the connection it opened.

use crate::nfs4_util;

use std::sync::Arc;
use std::time::Duration;

use crate::nfs4_util::{Client, compound_reply, fh_of, fore, me, owner, stateid_of};
use bytes::Bytes;
use nfs::nfs4::Nfsstat4;
use nfs::nfs4::args::{CreateSessionArgs, OpArgs};
use nfs::nfs4::callback::program::{CallbackProgram, CbEvent};
use nfs::nfs4::consts::{lock_type, open_result, seq4_status, session_flags, share};
use nfs::nfs4::res::OpRes;
use nfs::nfs4::server::Nfs4Config;
use nfs::nfs4::types::{AuthSysParms, CallbackSecParms4, ClientOwner4, StateProtectA};
use nfs::serve::{ServeConfig, Served, start};
use oncrpc::auth::{AuthSys, OpaqueAuth};
use oncrpc::{ClientConfig, Dispatcher, RpcClient, RpcTransport, TcpClient};
use tokio::sync::mpsc;

/// The callback program number the test clients give (any number; Linux uses 0x40000000).
const CB_PROG: u32 = 0x4000_0000;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Transport {
    Tcp,
    Rdma,
}

/// A server on loopback serving NFSv4.1 over TCP and RDMA, callbacks timing out after
/// `cb_timeout`.
async fn serve(dir: &std::path::Path, cb_timeout: Duration) -> Served {
    let mut cfg = ServeConfig::new(dir);
    cfg.tcp = Some(nfs4_util::local());
    cfg.rdma = Some(nfs4_util::local());
    cfg.portmap = None;
    let mut v4 = Nfs4Config::default().with_grace(Duration::ZERO);
    v4.state.callbacks.timeout = cb_timeout;
    cfg.nfs4 = Some(v4);
    start(cfg).await.unwrap()
}

fn cred() -> OpaqueAuth {
    let (uid, gid) = me();
    OpaqueAuth::sys(&AuthSys {
        stamp: 1,
        machinename: Bytes::from_static(b"test"),
        uid,
        gid,
        gids: vec![],
    })
}

/// A connection to the server over `t`, answering callbacks when `answer`.
async fn connect(
    served: &Served,
    t: Transport,
    answer: bool,
) -> (RpcClient, mpsc::Receiver<CbEvent>) {
    let (prog, events) = CallbackProgram::new(CB_PROG);
    let programs = Dispatcher::new().with(prog);
    let transport: Arc<dyn RpcTransport> = match t {
        Transport::Tcp => {
            let mut cfg = ClientConfig::default();
            if answer {
                cfg = cfg.with_backchannel(Arc::new(programs));
            }
            Arc::new(
                TcpClient::connect_with(served.nfs_addr.unwrap(), cfg)
                    .await
                    .unwrap(),
            )
        }
        Transport::Rdma => nfs4_util::rdma_client(served, answer.then_some(programs)).await,
    };
    (
        RpcClient::new(transport, 100003, 4).with_cred(cred()),
        events,
    )
}

/// EXCHANGE_ID, CREATE_SESSION (asking for the back channel when `back`), RECLAIM_COMPLETE.
async fn session(rpc: RpcClient, name: &str, back: bool) -> (Client, u32) {
    let r = compound_reply(
        &rpc,
        1,
        &[OpArgs::ExchangeId {
            owner: ClientOwner4 {
                verifier: [3; 8],
                ownerid: owner(name.as_bytes()),
            },
            flags: 0,
            protect: StateProtectA::None,
            impl_id: None,
        }],
    )
    .await;
    let OpRes::ExchangeId(x) = &r.results[0] else {
        panic!("EXCHANGE_ID: {r:?}");
    };
    let (uid, gid) = me();
    let r = compound_reply(
        &rpc,
        1,
        &[OpArgs::CreateSession(Box::new(CreateSessionArgs {
            clientid: x.clientid,
            sequence: x.sequenceid,
            flags: if back {
                session_flags::CONN_BACK_CHAN
            } else {
                0
            },
            fore: fore(16),
            back: fore(4),
            cb_program: CB_PROG,
            sec: vec![CallbackSecParms4::Sys(AuthSysParms {
                stamp: 1,
                machinename: Bytes::from_static(b"test"),
                uid,
                gid,
                gids: vec![],
            })],
        }))],
    )
    .await;
    let OpRes::CreateSession(cs) = &r.results[0] else {
        panic!("CREATE_SESSION: {r:?}");
    };
    let flags = cs.flags;
    let mut c = Client {
        rpc,
        clientid: x.clientid,
        session: cs.session,
        seq: 0,
        minor: 1,
    };
    c.ok(vec![OpArgs::ReclaimComplete(false)]).await;
    (c, flags)
}

/// SEQUENCE's `sr_status_flags`.
async fn status_flags(c: &mut Client) -> u32 {
    let r = c.call(vec![]).await;
    let OpRes::Sequence(s) = &r.results[0] else {
        panic!("SEQUENCE: {r:?}");
    };
    s.status_flags
}

/// SEQUENCE until its flags satisfy `f` (the probe's outcome reaches the server a little
/// after the client saw the probe); at most `tries` times, 50 ms apart.
async fn flags_until(c: &mut Client, tries: u32, f: impl Fn(u32) -> bool) -> u32 {
    let mut flags = status_flags(c).await;
    for _ in 0..tries {
        if f(flags) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        flags = status_flags(c).await;
    }
    flags
}

/// The callback counters once no callback is in flight (a client's answer reaches the server
/// a little after the client saw the callback); at most 100 looks, 50 ms apart.
async fn settled(served: &Served) -> nfs::nfs4::state::CallbackCounts {
    let mut counts = served.nfs4().unwrap().state().callback_counts();
    for _ in 0..100 {
        if counts.in_flight == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        counts = served.nfs4().unwrap().state().callback_counts();
    }
    counts
}

async fn next_event(events: &mut mpsc::Receiver<CbEvent>) -> CbEvent {
    tokio::time::timeout(Duration::from_secs(20), events.recv())
        .await
        .expect("no callback within 20 s")
        .expect("callback program gone")
}

async fn probe_answered(t: Transport) {
    let tmp = tempfile::tempdir().unwrap();
    let served = serve(tmp.path(), Duration::from_secs(10)).await;
    let (rpc, mut events) = connect(&served, t, true).await;
    let (mut c, flags) = session(rpc, "probe-ok", true).await;
    // RFC 8881 §18.36.4: the back channel is granted on this connection.
    assert_ne!(flags & session_flags::CONN_BACK_CHAN, 0, "{t:?}");
    assert_eq!(next_event(&mut events).await, CbEvent::Null, "{t:?}");
    let flags = flags_until(&mut c, 100, |f| f == 0).await;
    assert_eq!(flags, 0, "{t:?}: SEQUENCE flags after a good probe");
    let counts = settled(&served).await;
    assert_eq!(counts.sent, 1, "{t:?}: {counts:?}");
    assert_eq!(counts.answered, 1, "{t:?}: {counts:?}");
    assert_eq!(counts.failed, 0, "{t:?}: {counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cb_null_probe_over_tcp() {
    probe_answered(Transport::Tcp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cb_null_probe_over_rdma() {
    probe_answered(Transport::Rdma).await;
}

/// A client that never answers its back channel: the probe times out and SEQUENCE says
/// SEQ4_STATUS_CB_PATH_DOWN.
async fn probe_unanswered(t: Transport) {
    let tmp = tempfile::tempdir().unwrap();
    let served = serve(tmp.path(), Duration::from_millis(300)).await;
    let (rpc, _events) = connect(&served, t, false).await;
    let (mut c, _) = session(rpc, "probe-lost", true).await;
    let flags = flags_until(&mut c, 200, |f| f != 0).await;
    assert_eq!(flags, seq4_status::CB_PATH_DOWN, "{t:?}");
    let counts = served.nfs4().unwrap().state().callback_counts();
    assert_eq!((counts.sent, counts.failed), (1, 1), "{t:?}: {counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_probe_over_tcp_is_cb_path_down() {
    probe_unanswered(Transport::Tcp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_probe_over_rdma_is_cb_path_down() {
    probe_unanswered(Transport::Rdma).await;
}

/// A session created without the back channel: no probe can go, the path is down for the
/// client and for the session (SEQ4_STATUS_CB_PATH_DOWN | SEQ4_STATUS_CB_PATH_DOWN_SESSION).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_back_channel_is_cb_path_down() {
    let tmp = tempfile::tempdir().unwrap();
    let served = serve(tmp.path(), Duration::from_secs(10)).await;
    let (rpc, _events) = connect(&served, Transport::Tcp, true).await;
    let (mut c, flags) = session(rpc, "no-back", false).await;
    assert_eq!(flags & session_flags::CONN_BACK_CHAN, 0);
    assert_eq!(
        status_flags(&mut c).await,
        seq4_status::CB_PATH_DOWN | seq4_status::CB_PATH_DOWN_SESSION
    );
    assert_eq!(served.nfs4().unwrap().state().callback_counts().sent, 0);
}

/// The connection that carried a session's back channel closes while another connection goes
/// on using the session: the server unbinds it, and SEQUENCE says the session has no back
/// channel (SEQ4_STATUS_CB_PATH_DOWN_SESSION, RFC 8881 §2.10.13.1) so the client binds another.
async fn back_channel_connection_closed(t: Transport) {
    let tmp = tempfile::tempdir().unwrap();
    let served = serve(tmp.path(), Duration::from_secs(10)).await;
    let (rpc, mut events) = connect(&served, t, true).await;
    let (c, flags) = session(rpc, "back-closed", true).await;
    assert_ne!(flags & session_flags::CONN_BACK_CHAN, 0, "{t:?}");
    assert_eq!(next_event(&mut events).await, CbEvent::Null, "{t:?}");
    // A second connection uses the session's fore channel (SP4_NONE: SEQUENCE binds it).
    let (rpc2, _events2) = connect(&served, t, false).await;
    let mut c2 = Client {
        rpc: rpc2,
        clientid: c.clientid,
        session: c.session,
        seq: c.seq,
        minor: 1,
    };
    assert_eq!(
        flags_until(&mut c2, 100, |f| f == 0).await,
        0,
        "{t:?}: the back channel is up"
    );
    // The first connection goes.
    drop(c);
    drop(events);
    // The server notices within its once-a-second sweep (15 s allowed, for a loaded machine).
    let flags = flags_until(&mut c2, 300, |f| f & seq4_status::CB_PATH_DOWN_SESSION != 0).await;
    assert_ne!(
        flags & seq4_status::CB_PATH_DOWN_SESSION,
        0,
        "{t:?}: flags {flags:#x} 15 s after the back channel's connection closed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_back_channel_connection_over_tcp_is_cb_path_down_session() {
    back_channel_connection_closed(Transport::Tcp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_back_channel_connection_over_rdma_is_cb_path_down_session() {
    back_channel_connection_closed(Transport::Rdma).await;
}

fn waiting_lock(sid: nfs::nfs4::types::Stateid4, who: &[u8], offset: u64, len: u64) -> OpArgs {
    let OpArgs::Lock {
        reclaim,
        offset,
        length,
        locker,
        ..
    } = nfs4_util::lock(sid, who, offset, len)
    else {
        unreachable!()
    };
    OpArgs::Lock {
        locktype: lock_type::WRITEW_LT,
        reclaim,
        offset,
        length,
        locker,
    }
}

/// Client A holds a write lock; client B's blocking LOCK is denied; A's LOCKU makes the
/// server send B CB_NOTIFY_LOCK (RFC 8881 §20.11) naming B's lock owner and the file.
async fn notify_lock(t: Transport) {
    let tmp = tempfile::tempdir().unwrap();
    let served = serve(tmp.path(), Duration::from_secs(10)).await;
    let (rpc_a, mut ev_a) = connect(&served, t, true).await;
    let (rpc_b, mut ev_b) = connect(&served, t, true).await;
    let (mut a, _) = session(rpc_a, "lock-a", true).await;
    let (mut b, _) = session(rpc_b, "lock-b", true).await;
    assert_eq!(next_event(&mut ev_a).await, CbEvent::Null);
    assert_eq!(next_event(&mut ev_b).await, CbEvent::Null);

    let r = a
        .ok(vec![
            OpArgs::Putrootfh,
            nfs4_util::open_args(b"oa", "f", share::ACCESS_BOTH, share::DENY_NONE, true),
            OpArgs::Getfh,
        ])
        .await;
    let OpRes::Open(o) = &r[1] else {
        panic!("{r:?}")
    };
    // RFC 8881 §18.16.3: the server may notify blocked lock waiters.
    assert_ne!(o.rflags & open_result::MAY_NOTIFY_LOCK, 0);
    let (sa, fh) = (stateid_of(&r[1]), fh_of(&r[2]));
    let r = a
        .ok(vec![
            OpArgs::Putfh(fh.clone()),
            nfs4_util::lock(sa, b"la", 0, 100),
        ])
        .await;
    let lock_a = stateid_of(&r[1]);

    let r = b
        .ok(vec![
            OpArgs::Putrootfh,
            nfs4_util::open_args(b"ob", "f", share::ACCESS_BOTH, share::DENY_NONE, false),
        ])
        .await;
    let sb = stateid_of(&r[1]);
    let r = b
        .call(vec![
            OpArgs::Putfh(fh.clone()),
            waiting_lock(sb, b"lb", 50, 10),
        ])
        .await;
    assert_eq!(r.status, Nfsstat4::DENIED, "{r:?}");
    assert_eq!(
        served
            .nfs4()
            .unwrap()
            .state()
            .callback_counts()
            .lock_waiters,
        1
    );

    a.ok(vec![
        OpArgs::Putfh(fh.clone()),
        OpArgs::Locku {
            locktype: lock_type::WRITE_LT,
            seqid: 0,
            stateid: lock_a,
            offset: 0,
            length: 100,
        },
    ])
    .await;
    match next_event(&mut ev_b).await {
        CbEvent::NotifyLock {
            session,
            sequenceid,
            fh: got,
            owner: o,
        } => {
            assert_eq!(session, b.session, "{t:?}");
            // The back channel's first CB_SEQUENCE (RFC 8881 §2.10.6.1: slot sequence ids
            // start at 1).
            assert_eq!(sequenceid, 1, "{t:?}");
            assert_eq!(got, fh, "{t:?}");
            assert_eq!(o.clientid, b.clientid, "{t:?}");
            assert_eq!(o.owner.as_bytes(), b"lb", "{t:?}");
        }
        other => panic!("{t:?}: expected CB_NOTIFY_LOCK, got {other:?}"),
    }
    // The waiter is woken without polling: its LOCK now succeeds.
    b.ok(vec![OpArgs::Putfh(fh), waiting_lock(sb, b"lb", 50, 10)])
        .await;
    assert!(ev_a.try_recv().is_err(), "A got a callback it should not");
    // The client answered before the server took the reply in: wait for it to land.
    let counts = settled(&served).await;
    assert_eq!(counts.lock_waiters, 0, "{counts:?}");
    assert_eq!((counts.sent, counts.answered), (3, 3), "{t:?}: {counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cb_notify_lock_over_tcp() {
    notify_lock(Transport::Tcp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cb_notify_lock_over_rdma() {
    notify_lock(Transport::Rdma).await;
}
