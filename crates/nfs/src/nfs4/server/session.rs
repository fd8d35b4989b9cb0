//! Client, session and stateid-table operations: EXCHANGE_ID (RFC 8881 §18.35),
//! CREATE_SESSION (§18.36), DESTROY_SESSION (§18.37), BIND_CONN_TO_SESSION (§18.34),
//! DESTROY_CLIENTID (§18.50), RECLAIM_COMPLETE (§18.51), BACKCHANNEL_CTL (§18.33),
//! TEST_STATEID (§18.48), FREE_STATEID (§18.38).

use oncrpc::Credential;

use super::super::args::OpArgs;
use super::super::res::OpRes;
use super::super::state::Principal;
use super::super::status::{Nfsstat4, Res4};
use super::super::types::StateProtectA;
use super::Nfs4Server;
use super::compound::Ctx;
use crate::nfs4::consts::op;

/// The principal of a call for EXCHANGE_ID and CREATE_SESSION: under AUTH_SYS the uid as
/// sent (before any squashing), AUTH_NONE callers are one principal.
pub(super) fn principal(c: &Credential) -> Principal {
    match c {
        Credential::Sys(s) => Principal::Sys(s.uid),
        _ => Principal::None,
    }
}

impl Nfs4Server {
    pub(super) fn session_op(&self, ctx: &mut Ctx<'_>, a: OpArgs) -> Res4<OpRes> {
        let now = ctx.now;
        let who = principal(ctx.req.cred);
        match a {
            OpArgs::ExchangeId {
                owner,
                flags,
                protect,
                ..
            } => {
                // Only SP4_NONE is offered: the machine-credential and SSV protections need
                // RPCSEC_GSS, which this server does not speak (RFC 8881 §18.35.4).
                if protect != StateProtectA::None {
                    return Err(Nfsstat4::NOTSUPP);
                }
                let ok = self
                    .state()
                    .exchange_id(&owner, flags, who, &self.identity, now)?;
                Ok(OpRes::ExchangeId(Box::new(ok)))
            }
            OpArgs::CreateSession(cs) => {
                // The back channel rides the same connection (RFC 8881 §2.10.3.1): granted
                // when the connection's transport can carry backward calls (TCP, and
                // RPC-over-RDMA by RFC 8167; not in-process calls).
                let back = self.back_possible(ctx.req.conn);
                let mut st = self.state();
                let ok = st.create_session(&cs, who, ctx.req.conn, back, now)?;
                // Probe the back channel (or find it missing), as Linux nfsd does after
                // CREATE_SESSION; the outcome shows in SEQUENCE's sr_status_flags.
                st.cb_probe(&ok.session, Some(ctx.minor));
                Ok(OpRes::CreateSession(Box::new(ok)))
            }
            OpArgs::DestroySession(id) => {
                self.state().destroy_session(&id)?;
                Ok(OpRes::Status(op::DESTROY_SESSION, Nfsstat4::OK))
            }
            OpArgs::BindConnToSession {
                session,
                dir,
                rdma_mode: _,
            } => {
                let mut st = self.state();
                let dir = st.bind_conn(&session, dir, ctx.req.conn, now)?;
                if dir != crate::nfs4::consts::cdfc::FORE {
                    // A new back channel connection: probe it.
                    st.cb_probe(&session, Some(ctx.minor));
                }
                drop(st);
                // RDMA mode is never granted: the connection keeps its framing.
                Ok(OpRes::BindConnToSession {
                    session,
                    dir,
                    rdma_mode: false,
                })
            }
            OpArgs::DestroyClientid(id) => {
                self.state().destroy_clientid(id)?;
                Ok(OpRes::Status(op::DESTROY_CLIENTID, Nfsstat4::OK))
            }
            OpArgs::ReclaimComplete(one_fs) => {
                let c = ctx.client()?;
                self.state().reclaim_complete(c, one_fs)?;
                Ok(OpRes::Status(op::RECLAIM_COMPLETE, Nfsstat4::OK))
            }
            OpArgs::BackchannelCtl { cb_program, sec } => {
                let c = ctx.client()?;
                let mut st = self.state();
                st.backchannel_ctl(c, cb_program, &sec)?;
                for s in st.sessions_of(c) {
                    st.cb_probe(&s, None);
                }
                drop(st);
                Ok(OpRes::Status(op::BACKCHANNEL_CTL, Nfsstat4::OK))
            }
            OpArgs::TestStateid(sids) => {
                let c = ctx.client()?;
                Ok(OpRes::TestStateid(self.state().test_stateids(c, &sids)))
            }
            OpArgs::FreeStateid(sid) => {
                let c = ctx.client()?;
                let sid = ctx.stateid(&sid)?;
                self.state().free_stateid(c, &sid)?;
                Ok(OpRes::Status(op::FREE_STATEID, Nfsstat4::OK))
            }
            _ => Err(Nfsstat4::SERVERFAULT),
        }
    }
}
