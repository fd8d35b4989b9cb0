//! NFSv4.0 (RFC 7530) on the wire: the five operations minor version 0 has and NFSv4.1 took
//! out (RFC 8881 §17 marks them "MNI", MUST NOT implement, and §15.2 lists NFS4ERR_NOTSUPP as
//! their only error in 4.1): OPEN_CONFIRM (RFC 7530 §16.18), RENEW (§16.28), SETCLIENTID
//! (§16.33), SETCLIENTID_CONFIRM (§16.34) and RELEASE_LOCKOWNER (§16.37).
//!
//! Every other 4.0 operation has the same arguments and results in 4.1 and uses the shared
//! decoders of [`super::args`] and encoders of [`super::res`]. Decoding is bounded (the client
//! string by `NFS4_OPAQUE_LIMIT`, the callback address strings by [`MAX_NETADDR`]) and never
//! panics.

use bytes::Bytes;
use xdr::{Decoder, Encoder, XdrEncode};

use super::consts::op;
use super::status::Nfsstat4;
use super::types::{Opaque1024, StateOwner4, Stateid4, Verifier4};

/// Longest `r_netid` and `r_addr` of a callback address (`netaddr4`, RFC 7530 §2.2) the
/// decoder accepts: universal addresses are at most a few dozen bytes.
pub const MAX_NETADDR: u32 = 256;

/// `nfs_client_id4` (RFC 7530 §2.2): the client's boot verifier and its identifier string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NfsClientId4 {
    pub verifier: Verifier4,
    pub id: Opaque1024,
}

/// `cb_client4` (RFC 7530 §2.2): where the client's callback service listens. This server
/// never connects to it (RFC 7530 §10.2: delegations, the only use of the callback path, are
/// never granted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CbClient4 {
    pub program: u32,
    pub netid: Bytes,
    pub addr: Bytes,
}

/// Arguments of the operations only NFSv4.0 has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Args40 {
    /// OPEN_CONFIRM4args (RFC 7530 §16.18.2).
    OpenConfirm { stateid: Stateid4, seqid: u32 },
    /// RENEW4args (§16.28.2): the clientid.
    Renew(u64),
    /// SETCLIENTID4args (§16.33.2).
    SetClientId {
        client: NfsClientId4,
        callback: CbClient4,
        callback_ident: u32,
    },
    /// SETCLIENTID_CONFIRM4args (§16.34.2).
    SetClientIdConfirm { clientid: u64, verifier: Verifier4 },
    /// RELEASE_LOCKOWNER4args (§16.37.2).
    ReleaseLockowner(StateOwner4),
}

impl Args40 {
    /// The operation number.
    pub fn opnum(&self) -> u32 {
        match self {
            Args40::OpenConfirm { .. } => op::OPEN_CONFIRM,
            Args40::Renew(_) => op::RENEW,
            Args40::SetClientId { .. } => op::SETCLIENTID,
            Args40::SetClientIdConfirm { .. } => op::SETCLIENTID_CONFIRM,
            Args40::ReleaseLockowner(_) => op::RELEASE_LOCKOWNER,
        }
    }

    /// Whether `opnum` is one of the operations only NFSv4.0 has.
    pub fn is_v40_only(opnum: u32) -> bool {
        matches!(
            opnum,
            op::OPEN_CONFIRM
                | op::RENEW
                | op::SETCLIENTID
                | op::SETCLIENTID_CONFIRM
                | op::RELEASE_LOCKOWNER
        )
    }

    /// Decode the arguments of `opnum`; `None` when it is not a 4.0-only operation (nothing is
    /// read then).
    pub fn decode(opnum: u32, d: &mut Decoder<'_>) -> xdr::Result<Option<Args40>> {
        Ok(Some(match opnum {
            op::OPEN_CONFIRM => Args40::OpenConfirm {
                stateid: d.get()?,
                seqid: d.u32()?,
            },
            op::RENEW => Args40::Renew(d.u64()?),
            op::SETCLIENTID => Args40::SetClientId {
                client: NfsClientId4 {
                    verifier: d.get()?,
                    id: d.get()?,
                },
                callback: CbClient4 {
                    program: d.u32()?,
                    netid: Bytes::copy_from_slice(d.string(MAX_NETADDR)?),
                    addr: Bytes::copy_from_slice(d.string(MAX_NETADDR)?),
                },
                callback_ident: d.u32()?,
            },
            op::SETCLIENTID_CONFIRM => Args40::SetClientIdConfirm {
                clientid: d.u64()?,
                verifier: d.get()?,
            },
            op::RELEASE_LOCKOWNER => Args40::ReleaseLockowner(d.get()?),
            _ => return Ok(None),
        }))
    }

    /// Append the arguments (without the operation number).
    pub fn encode(&self, e: &mut Encoder) {
        match self {
            Args40::OpenConfirm { stateid, seqid } => {
                stateid.encode(e);
                e.put_u32(*seqid);
            }
            Args40::Renew(c) => e.put_u64(*c),
            Args40::SetClientId {
                client,
                callback,
                callback_ident,
            } => {
                client.verifier.encode(e);
                client.id.encode(e);
                e.put_u32(callback.program);
                e.put_string(&callback.netid);
                e.put_string(&callback.addr);
                e.put_u32(*callback_ident);
            }
            Args40::SetClientIdConfirm { clientid, verifier } => {
                e.put_u64(*clientid);
                verifier.encode(e);
            }
            Args40::ReleaseLockowner(o) => o.encode(e),
        }
    }
}

/// Results of the 4.0-only operations that carry more than a status (RENEW,
/// SETCLIENTID_CONFIRM and RELEASE_LOCKOWNER answer a status alone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Res40 {
    /// SETCLIENTID4resok (RFC 7530 §16.33.3).
    SetClientId { clientid: u64, confirm: Verifier4 },
    /// SETCLIENTID's NFS4ERR_CLID_INUSE, which carries the `clientaddr4` of the record in use
    /// (§16.33.3). This server does not keep callback addresses: both strings are empty.
    ClidInUse,
    /// OPEN_CONFIRM4resok (§16.18.3): the open stateid with its seqid advanced.
    OpenConfirm(Stateid4),
}

impl Res40 {
    /// The operation number.
    pub fn opnum(&self) -> u32 {
        match self {
            Res40::SetClientId { .. } | Res40::ClidInUse => op::SETCLIENTID,
            Res40::OpenConfirm(_) => op::OPEN_CONFIRM,
        }
    }

    /// The status the result carries.
    pub fn status(&self) -> Nfsstat4 {
        match self {
            Res40::ClidInUse => Nfsstat4::CLID_INUSE,
            _ => Nfsstat4::OK,
        }
    }

    /// Append the body after the status.
    pub fn encode(&self, e: &mut Encoder) {
        match self {
            Res40::SetClientId { clientid, confirm } => {
                e.put_u64(*clientid);
                confirm.encode(e);
            }
            Res40::ClidInUse => {
                e.put_string(b"");
                e.put_string(b"");
            }
            Res40::OpenConfirm(s) => s.encode(e),
        }
    }

    /// Bytes of the body [`Res40::encode`] appends.
    pub fn encoded_len(&self) -> usize {
        match self {
            Res40::SetClientId { .. } => 16,
            Res40::ClidInUse => 8,
            Res40::OpenConfirm(_) => 16,
        }
    }

    /// Decode the body of `opnum`'s result with `status` (the client side); `None` for results
    /// that are a status alone.
    pub fn decode(opnum: u32, status: Nfsstat4, d: &mut Decoder<'_>) -> xdr::Result<Option<Res40>> {
        Ok(match (opnum, status) {
            (op::SETCLIENTID, Nfsstat4::OK) => Some(Res40::SetClientId {
                clientid: d.u64()?,
                confirm: d.get()?,
            }),
            (op::SETCLIENTID, Nfsstat4::CLID_INUSE) => {
                d.string(MAX_NETADDR)?;
                d.string(MAX_NETADDR)?;
                Some(Res40::ClidInUse)
            }
            (op::OPEN_CONFIRM, Nfsstat4::OK) => Some(Res40::OpenConfirm(d.get()?)),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_args() -> impl Strategy<Value = Args40> {
        prop_oneof![
            (any::<u32>(), any::<[u8; 12]>(), any::<u32>()).prop_map(|(s, o, q)| {
                Args40::OpenConfirm {
                    stateid: Stateid4 { seqid: s, other: o },
                    seqid: q,
                }
            }),
            any::<u64>().prop_map(Args40::Renew),
            (
                any::<[u8; 8]>(),
                proptest::collection::vec(any::<u8>(), 0..64),
                any::<u32>(),
                "[a-z0-9]{0,8}",
                "[0-9.]{0,20}",
                any::<u32>()
            )
                .prop_map(|(v, id, p, n, a, i)| Args40::SetClientId {
                    client: NfsClientId4 {
                        verifier: v,
                        id: Opaque1024::from_slice(&id),
                    },
                    callback: CbClient4 {
                        program: p,
                        netid: Bytes::from(n.into_bytes()),
                        addr: Bytes::from(a.into_bytes()),
                    },
                    callback_ident: i,
                }),
            (any::<u64>(), any::<[u8; 8]>()).prop_map(|(c, v)| Args40::SetClientIdConfirm {
                clientid: c,
                verifier: v
            }),
            (any::<u64>(), proptest::collection::vec(any::<u8>(), 0..64)).prop_map(|(c, o)| {
                Args40::ReleaseLockowner(StateOwner4 {
                    clientid: c,
                    owner: Opaque1024::from_slice(&o),
                })
            }),
        ]
    }

    proptest! {
        #[test]
        fn args_round_trip(a in arb_args()) {
            let mut e = Encoder::new();
            a.encode(&mut e);
            let b = e.into_bytes();
            let mut d = Decoder::new(&b);
            let back = Args40::decode(a.opnum(), &mut d).unwrap();
            prop_assert_eq!(back, Some(a));
            prop_assert_eq!(d.remaining(), 0);
        }

        #[test]
        fn decode_never_panics(opnum in 0u32..64, bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut d = Decoder::new(&bytes);
            let r = Args40::decode(opnum, &mut d);
            if !Args40::is_v40_only(opnum) {
                prop_assert_eq!(r, Ok(None));
            }
        }

        #[test]
        fn res_round_trip(c in any::<u64>(), v in any::<[u8; 8]>(), s in any::<u32>(), o in any::<[u8; 12]>()) {
            for r in [
                Res40::SetClientId { clientid: c, confirm: v },
                Res40::ClidInUse,
                Res40::OpenConfirm(Stateid4 { seqid: s, other: o }),
            ] {
                let mut e = Encoder::new();
                r.encode(&mut e);
                let b = e.into_bytes();
                prop_assert_eq!(b.len(), r.encoded_len());
                let mut d = Decoder::new(&b);
                prop_assert_eq!(Res40::decode(r.opnum(), r.status(), &mut d).unwrap(), Some(r));
            }
        }
    }

    #[test]
    fn oversized_callback_address_is_refused() {
        let mut e = Encoder::new();
        [0u8; 8].encode(&mut e);
        Opaque1024::from_slice(b"c").encode(&mut e);
        e.put_u32(0x4000_0000);
        e.put_string(&[b't'; MAX_NETADDR as usize + 1]);
        let b = e.into_bytes();
        let mut d = Decoder::new(&b);
        assert!(Args40::decode(op::SETCLIENTID, &mut d).is_err());
    }
}
