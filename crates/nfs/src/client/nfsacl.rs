//! The NFSACL client (GETACL), with the binding that provisions its reply.

use std::sync::Arc;

use oncrpc::{OpaqueAuth, ReplyExpectation, RpcTransport};

use super::{Caller, ClientError, auth_sys};
use crate::nfs3::*;
use crate::ulb;

/// An NFSACL version 3 client (program 100227): GETACL over any transport. Over
/// RPC-over-RDMA the reply is provisioned for [`ulb::NfsAclBinding::initial_entries`] entries
/// per ACL; give the transport the same binding so that a longer ACL is fetched with short
/// Reply chunk retry (RFC 8267 §3.1, §5.2).
#[derive(Clone)]
pub struct NfsAclClient {
    c: Caller,
    binding: ulb::NfsAclBinding,
}

impl std::fmt::Debug for NfsAclClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NfsAclClient")
            .field("transport", &self.c.rpc.describe())
            .field("binding", &self.binding)
            .finish_non_exhaustive()
    }
}

impl NfsAclClient {
    /// A client that calls with AUTH_NONE and the default reply estimate.
    pub fn new(rpc: Arc<dyn RpcTransport>) -> Self {
        NfsAclClient {
            c: Caller {
                rpc,
                cred: OpaqueAuth::none(),
                timeout: None,
            },
            binding: ulb::NfsAclBinding::default(),
        }
    }

    /// Use this binding's reply estimate.
    pub fn with_binding(mut self, binding: ulb::NfsAclBinding) -> Self {
        self.binding = binding;
        self
    }

    /// Call with an AUTH_SYS credential.
    pub fn with_auth_sys(mut self, uid: u32, gid: u32, gids: Vec<u32>) -> Self {
        self.c.cred = auth_sys(uid, gid, gids);
        self
    }

    /// GETACL: the ACLs of `fh` that `mask` asks for ([`crate::nfsacl::mask`]).
    pub async fn getacl(
        &self,
        fh: Fh3,
        mask: u32,
    ) -> Result<crate::nfsacl::GetAclRes, ClientError> {
        use rpcrdma::ulb::UpperLayerBinding;
        let args = crate::nfsacl::GetAclArgs { fh, mask };
        let reply = ReplyExpectation {
            max_len: self.binding.max_reply_size(
                crate::nfsacl::VERSION,
                crate::nfsacl::proc_::GETACL,
                &[],
            ),
            ddp_items: Vec::new(),
        };
        self.c
            .call(
                crate::nfsacl::PROGRAM,
                crate::nfsacl::VERSION,
                crate::nfsacl::proc_::GETACL,
                args,
                reply,
            )
            .await
    }
}
