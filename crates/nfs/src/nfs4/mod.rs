//! NFSv4.0, NFSv4.1 and NFSv4.2 (RFC 7530, RFC 8881, RFC 7862): the protocol types, checked
//! decoders and exact encoders the server's COMPOUND executor is built on.
//!
//! - [`consts`]: operation, attribute and flag numbers; [`status`]: `nfsstat4`.
//! - [`types`]: the shared types (stateids, bitmaps, `fattr4`, channel attributes, owners),
//!   each bounded on decode.
//! - [`args`]: one decoder per operation's arguments; [`res`]: one encoder per result;
//!   [`compound`]: the COMPOUND envelope.
//! - [`attrs`]: the supported attributes, their encoding from a file's status, and the
//!   settable ones read back.
//! - [`client_codec`]: the client half: arguments encoded, results decoded.
//! - [`state`]: the sans-IO state core; [`server`]: the COMPOUND executor and the NFS program
//!   serving versions 3 and 4 together.
//! - [`callback`]: the back channel (RFC 8881 §20): CB_NULL probes and CB_NOTIFY_LOCK.
//! - [`v40`]: the operations only NFSv4.0 (RFC 7530) has; minor version 0 is served by the
//!   same executor (clientids by SETCLIENTID, seqid-ordered owners, no sessions, no callback
//!   path).
//!
//! What it does not do: RPCSEC_GSS-only features (SP4_MACH_CRED, SP4_SSV, SET_SSV), pNFS
//! layouts, delegations and the callbacks that recall them (4.1 callbacks are CB_NULL and
//! CB_NOTIFY_LOCK only; 4.0 gets none), named
//! attributes, ACLs, COPY/CLONE/READ_PLUS and the extended-attribute operations (NOTSUPP).

pub mod args;
pub mod attrs;
pub mod callback;
pub mod client_codec;
pub mod compound;
pub mod consts;
pub mod res;
pub mod server;
pub mod state;
pub mod status;
pub mod types;
pub mod v40;

pub use status::{Nfsstat4, Res4};
