//! Authentication flavors: AUTH_NONE, AUTH_SYS (RFC 5531 §8.2, §10) and enough of RPCSEC_GSS
//! (RFC 2203 §5) to tell which service a call uses.

use bytes::Bytes;
use xdr::{Decoder, Encoder, XdrError};

/// `AUTH_NONE`.
pub const AUTH_NONE: u32 = 0;
/// `AUTH_SYS` (formerly AUTH_UNIX).
pub const AUTH_SYS: u32 = 1;
/// `AUTH_SHORT`.
pub const AUTH_SHORT: u32 = 2;
/// `RPCSEC_GSS` (RFC 2203).
pub const RPCSEC_GSS: u32 = 6;

/// RFC 5531 §8.2: the body of an opaque_auth is at most 400 bytes.
pub const MAX_AUTH_BYTES: u32 = 400;
/// RFC 5531 §14 (authsys_parms): machinename<255>.
pub const MAX_MACHINE_NAME: u32 = 255;
/// RFC 5531 §14 (authsys_parms): gids<16>.
pub const MAX_GIDS: u32 = 16;

/// `opaque_auth` (RFC 5531 §8.2).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OpaqueAuth {
    pub flavor: u32,
    pub body: Bytes,
}

impl OpaqueAuth {
    /// AUTH_NONE with an empty body.
    pub const fn none() -> Self {
        OpaqueAuth {
            flavor: AUTH_NONE,
            body: Bytes::new(),
        }
    }

    /// An AUTH_SYS credential carrying `parms`.
    pub fn sys(parms: &AuthSys) -> Self {
        let mut enc = Encoder::with_capacity(parms.encoded_len());
        parms.encode(&mut enc);
        OpaqueAuth {
            flavor: AUTH_SYS,
            body: enc.into_bytes(),
        }
    }

    /// Encode.
    pub fn encode(&self, enc: &mut Encoder) {
        enc.put_u32(self.flavor);
        enc.put_opaque(&self.body);
    }

    /// Exact encoded length.
    pub fn encoded_len(&self) -> usize {
        4 + xdr::opaque_len(self.body.len())
    }

    /// Decode, enforcing the 400-byte limit.
    pub fn decode(dec: &mut Decoder<'_>) -> Result<Self, XdrError> {
        let flavor = dec.u32()?;
        let body = dec.opaque_bytes(MAX_AUTH_BYTES)?;
        Ok(OpaqueAuth { flavor, body })
    }
}

/// `authsys_parms` (RFC 5531 §14).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AuthSys {
    pub stamp: u32,
    pub machinename: Bytes,
    pub uid: u32,
    pub gid: u32,
    pub gids: Vec<u32>,
}

impl AuthSys {
    /// Encode.
    pub fn encode(&self, enc: &mut Encoder) {
        enc.put_u32(self.stamp);
        enc.put_string(&self.machinename);
        enc.put_u32(self.uid);
        enc.put_u32(self.gid);
        enc.put_array(&self.gids, |e, g| e.put_u32(*g));
    }

    /// Exact encoded length.
    pub fn encoded_len(&self) -> usize {
        4 + xdr::opaque_len(self.machinename.len()) + 8 + 4 + 4 * self.gids.len()
    }

    /// Decode from the body of an AUTH_SYS credential; the whole body must be consumed.
    pub fn decode_body(body: &Bytes) -> Result<Self, XdrError> {
        let mut dec = Decoder::from_bytes(body);
        let stamp = dec.u32()?;
        let machinename = dec.opaque_bytes(MAX_MACHINE_NAME)?;
        let uid = dec.u32()?;
        let gid = dec.u32()?;
        let gids = dec.array(MAX_GIDS, |d| d.u32())?;
        dec.finish()?;
        Ok(AuthSys {
            stamp,
            machinename,
            uid,
            gid,
            gids,
        })
    }
}

/// RPCSEC_GSS service (RFC 2203 §5: `rpc_gss_service_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GssService {
    None,
    Integrity,
    Privacy,
}

/// RPCSEC_GSS control procedure (RFC 2203 §5: `rpc_gss_proc_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GssProc {
    Data,
    Init,
    ContinueInit,
    Destroy,
}

/// The parts of an `rpc_gss_cred_vers_1_t` credential that transports care about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GssCred {
    pub proc_: GssProc,
    pub seq_num: u32,
    pub service: GssService,
    pub handle: Bytes,
}

impl GssCred {
    /// Decode the body of an RPCSEC_GSS credential (version 1 only).
    pub fn decode_body(body: &Bytes) -> Result<Self, XdrError> {
        let mut dec = Decoder::from_bytes(body);
        let vers = dec.u32()?;
        if vers != 1 {
            return Err(XdrError::InvalidDiscriminant {
                type_name: "rpc_gss_cred_t version",
                value: i64::from(vers),
            });
        }
        let proc_ = dec.enumeration("rpc_gss_proc_t", |v| match v {
            0 => Some(GssProc::Data),
            1 => Some(GssProc::Init),
            2 => Some(GssProc::ContinueInit),
            3 => Some(GssProc::Destroy),
            _ => None,
        })?;
        let seq_num = dec.u32()?;
        let service = dec.enumeration("rpc_gss_service_t", |v| match v {
            1 => Some(GssService::None),
            2 => Some(GssService::Integrity),
            3 => Some(GssService::Privacy),
            _ => None,
        })?;
        let handle = dec.opaque_bytes(MAX_AUTH_BYTES)?;
        dec.finish()?;
        Ok(GssCred {
            proc_,
            seq_num,
            service,
            handle,
        })
    }
}

/// A call's credential, parsed as far as this crate understands it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Credential {
    None,
    Sys(AuthSys),
    Gss(GssCred),
    /// A flavor this crate does not parse; the raw credential is kept.
    Other(OpaqueAuth),
}

impl Credential {
    /// Parse a credential. A malformed AUTH_SYS or RPCSEC_GSS body is an error that the server
    /// answers with AUTH_ERROR / AUTH_BADCRED (RFC 5531 §9).
    pub fn parse(cred: &OpaqueAuth) -> Result<Self, XdrError> {
        Ok(match cred.flavor {
            AUTH_NONE => Credential::None,
            AUTH_SYS => Credential::Sys(AuthSys::decode_body(&cred.body)?),
            RPCSEC_GSS => Credential::Gss(GssCred::decode_body(&cred.body)?),
            _ => Credential::Other(cred.clone()),
        })
    }

    /// [`Credential::forbids_reduction`] of a credential not yet parsed: only an RPCSEC_GSS
    /// body is decoded (an AUTH_SYS one, with its list of groups, is not: this runs for every
    /// call RPC-over-RDMA sends and receives). A malformed body forbids nothing here; the
    /// server answers it with AUTH_BADCRED when it parses the credential itself.
    pub fn forbids_reduction_of(cred: &OpaqueAuth) -> bool {
        cred.flavor == RPCSEC_GSS
            && GssCred::decode_body(&cred.body)
                .is_ok_and(|g| matches!(g.service, GssService::Integrity | GssService::Privacy))
    }

    /// True when the call's arguments and results are wrapped by RPCSEC_GSS integrity or
    /// privacy. RPC-over-RDMA must not reduce such payloads (RFC 8166 §8.2.2.3).
    pub fn forbids_reduction(&self) -> bool {
        matches!(
            self,
            Credential::Gss(GssCred {
                service: GssService::Integrity | GssService::Privacy,
                ..
            })
        )
    }
}
