//! What a Requester decides about a call before it is encoded and after it fails, sans-IO.
//!
//! - [`CallPolicy::encoding`]: whether the call's DDP-eligible arguments may be reduced into
//!   Read chunks (and its results into Write chunks), and with which encoder policy: nothing
//!   is reduced under RPCSEC_GSS integrity or privacy (RFC 8166 §8.2.2.3) nor for a program
//!   whose binding makes no item DDP-eligible (RFC 8166 §6.1).
//! - [`CallPolicy::short_reply_retry_size`]: after RDMA_ERR_CHUNK, the larger Reply chunk to
//!   ask for in a new transaction, when the program's binding allows it (RFC 8267 §3.1).
//!
//! [`crate::requester::Requester::call_policy`] hands one to the driver, which consults it
//! without taking the Requester's lock.

use std::sync::Arc;

use oncrpc::{CallRequest, Credential};
use xdr::{DdpPolicy, Encoder};

use crate::engine::Config;
use crate::ulb::Bindings;

/// How one call is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallEncoding {
    /// The encoder's policy for the whole call message.
    pub policy: DdpPolicy,
    /// Nothing of this call may be reduced, in either direction (for
    /// [`crate::requester::OutCall::no_reduction`]). Long messages still use chunks.
    pub no_reduction: bool,
}

/// A Requester's per-call decisions (see the module documentation).
pub struct CallPolicy {
    ulbs: Arc<Bindings>,
    /// Programs whose Upper-Layer Binding makes some item DDP-eligible: only their calls are
    /// encoded with reduction (RFC 8166 §6.1).
    reducing: crate::engine::IdSet<u32>,
    ddp_min: usize,
    max_read_chunks: usize,
    default_reply_chunk: usize,
}

impl std::fmt::Debug for CallPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallPolicy")
            .field("reducing", &self.reducing)
            .field("ddp_min", &self.ddp_min)
            .field("max_read_chunks", &self.max_read_chunks)
            .finish_non_exhaustive()
    }
}

impl CallPolicy {
    /// The policy of a Requester with settings `cfg` and bindings `ulbs` (by program).
    pub fn new(cfg: &Config, ulbs: Arc<Bindings>) -> Self {
        let reducing = ulbs
            .values()
            .filter(|u| u.has_ddp_items())
            .map(|u| u.program())
            .collect();
        CallPolicy {
            ulbs,
            reducing,
            ddp_min: cfg.ddp_min,
            max_read_chunks: cfg.max_read_chunks,
            default_reply_chunk: cfg.default_reply_chunk,
        }
    }

    /// How to encode `req`. Calls of programs without a binding are encoded inline here and
    /// refused by [`crate::requester::Requester::submit`] (RFC 8166 §6).
    pub fn encoding(&self, req: &CallRequest) -> CallEncoding {
        // Nothing is reduced under RPCSEC_GSS integrity or privacy (RFC 8166 §8.2.2.3), nor
        // for a program whose binding makes nothing DDP-eligible (RFC 8166 §6.1: only items
        // a binding marks DDP-eligible may be reduced). Long messages still use chunks.
        //= specs/rfc8166.txt#section-8.2.2.3
        //# Therefore, a sender MUST NOT reduce a Payload stream when RPCSEC_GSS integrity or
        //# encryption services are in use.
        //= specs/rfc8166.txt#section-3.4.2
        //# All other XDR data items MUST NOT be reduced.
        //= specs/rfc8166.txt#section-6.1
        //# Senders MUST NOT reduce data items that are not DDP-eligible.
        let no_reduction =
            Credential::forbids_reduction_of(&req.cred) || !self.reducing.contains(&req.prog);
        let policy = if no_reduction {
            DdpPolicy::Inline
        } else {
            DdpPolicy::Reduce {
                min_len: self.ddp_min,
                max_items: self.max_read_chunks,
            }
        };
        CallEncoding {
            policy,
            no_reduction,
        }
    }

    /// The reply size to announce on short Reply chunk retry number `attempt` (from 1) of
    /// `req`, after its transmission with `req.reply.max_len` ended in RDMA_ERR_CHUNK, or
    /// `None` when its binding allows no (more) retries. RFC 8267 §3.1: a reply that did not
    /// fit may be asked for again, as a new transaction (a new XID, so that no cached reply
    /// holding the error answers it) with a larger Reply chunk, for the operations the
    /// binding allows, and not indefinitely (ERR_CHUNK has other causes).
    pub fn short_reply_retry_size(&self, req: &CallRequest, attempt: u32) -> Option<usize> {
        let ulb = self.ulbs.get(&req.prog)?;
        let mut enc = Encoder::new();
        (req.args)(&mut enc);
        let args = enc.finish().to_bytes();
        let previous = req
            .reply
            .max_len
            .or_else(|| ulb.max_reply_size(req.vers, req.proc_, &args))
            .unwrap_or(self.default_reply_chunk);
        ulb.short_reply_retry(req.vers, req.proc_, &args, attempt, previous)
            .filter(|&n| n > previous)
    }
}

#[cfg(test)]
mod tests {
    use std::ops::Range;

    use oncrpc::OpaqueAuth;

    use super::*;
    use crate::ulb::{InlineBinding, UlbError, UpperLayerBinding};

    /// Program 7: every call may be reduced; procedure 1 may be retried twice, doubling.
    struct Retrying;

    impl UpperLayerBinding for Retrying {
        fn program(&self) -> u32 {
            7
        }
        fn call_ddp_items(
            &self,
            _vers: u32,
            _proc_: u32,
            _args: &[u8],
        ) -> Result<Vec<Range<usize>>, UlbError> {
            Ok(Vec::new())
        }
        fn max_reply_size(&self, _vers: u32, _proc_: u32, args: &[u8]) -> Option<usize> {
            Some(1000 + args.len())
        }
        fn short_reply_retry(
            &self,
            _vers: u32,
            proc_: u32,
            _args: &[u8],
            attempt: u32,
            previous: usize,
        ) -> Option<usize> {
            (proc_ == 1 && attempt <= 2).then_some(previous * 2)
        }
    }

    fn policy() -> CallPolicy {
        let ulbs: Vec<Arc<dyn UpperLayerBinding>> =
            vec![Arc::new(Retrying), Arc::new(InlineBinding::new(8, 1..=1))];
        CallPolicy::new(
            &Config::default(),
            Arc::new(ulbs.into_iter().map(|u| (u.program(), u)).collect()),
        )
    }

    fn call(prog: u32, proc_: u32) -> CallRequest {
        CallRequest::new(prog, 1, proc_, |e: &mut Encoder| e.put_u32(5))
    }

    //= specs/rfc8166.txt#section-3.4.2
    //= type=test
    //# All other XDR data items MUST NOT be reduced.
    //= specs/rfc8166.txt#section-6.1
    //= type=test
    //# Senders MUST NOT reduce data items that are not DDP-eligible.
    //= specs/rfc8166.txt#section-8.2.2.3
    //= type=test
    //# Therefore, a sender MUST NOT reduce a Payload stream when RPCSEC_GSS integrity or encryption
    //# services are in use.
    #[test]
    fn reduction_only_for_bindings_with_eligible_items_and_never_under_gss() {
        let p = policy();
        let cfg = Config::default();
        assert_eq!(
            p.encoding(&call(7, 1)),
            CallEncoding {
                policy: DdpPolicy::Reduce {
                    min_len: cfg.ddp_min,
                    max_items: cfg.max_read_chunks
                },
                no_reduction: false
            }
        );
        for prog in [8, 9] {
            let e = p.encoding(&call(prog, 1));
            assert_eq!((e.policy, e.no_reduction), (DdpPolicy::Inline, true));
        }
        // RPCSEC_GSS (flavor 6), integrity service: RFC 8166 §8.2.2.3.
        let mut body = Encoder::new();
        for w in [1, 0, 1, 2] {
            body.put_u32(w);
        }
        body.put_opaque(b"ctx");
        let mut gss = call(7, 1);
        gss.cred = OpaqueAuth {
            flavor: 6,
            body: body.into_bytes(),
        };
        assert!(p.encoding(&gss).no_reduction);
    }

    #[test]
    fn short_reply_retries_grow_and_stop() {
        let p = policy();
        let mut req = call(7, 1);
        // The first announced size is the binding's bound: 1000 plus 4 bytes of arguments.
        assert_eq!(p.short_reply_retry_size(&req, 1), Some(2008));
        req.reply.max_len = Some(2008);
        assert_eq!(p.short_reply_retry_size(&req, 2), Some(4016));
        assert_eq!(p.short_reply_retry_size(&req, 3), None);
        // Procedures and programs the binding does not allow, and programs without one.
        assert_eq!(p.short_reply_retry_size(&call(7, 2), 1), None);
        assert_eq!(p.short_reply_retry_size(&call(8, 1), 1), None);
        assert_eq!(p.short_reply_retry_size(&call(9, 1), 1), None);
    }
}
