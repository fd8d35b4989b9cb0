//! # nfs — NFS on RPC-over-RDMA for oxrdma
//!
//! What it does:
//! - [`nfs3`], [`mount`], [`portmap`]: the NFSv3 (RFC 1813), MOUNT v3 (RFC 1813 Appendix I)
//!   and port mapper v2 / rpcbind v3-v4 (RFC 1833) protocol types, with checked decoding (never
//!   panics, bounded lengths) and exact encoding.
//! - [`ulb`]: the NFS Upper-Layer Binding for RPC-over-RDMA (RFC 8267): which items are
//!   DDP-eligible for NFSv2/v3 and NFSv4.x (with a COMPOUND scanner that skips every
//!   operation's arguments), Write-chunk pairing, chunk-complexity limits, reply-size
//!   estimation and the short Reply chunk retry policy. [`ulb::NfsBinding`] implements
//!   `rpcrdma::ulb::UpperLayerBinding`.
//! - [`vfs`] and [`server`]: an NFSv3 server over a local directory, served as
//!   `oncrpc::Program`s (NFS 100003 v3, MOUNT 100005 v3). Stateless file handles that survive
//!   a restart, paths confined to the export (no `..` or symlink escape), AUTH_SYS permission
//!   checks, real `fsync` for COMMIT and stable WRITEs.
//! - [`fsops`]: the file operations NFSv3 and NFSv4 share (lookup, access, read, write,
//!   commit, the create modes, mkdir, symlink, mknod, remove, rename, link, directory entries,
//!   setattr, fsstat, seek, allocate) with their AUTH_SYS rules, so both versions behave alike.
//! - [`nfs4`]: NFSv4.1 (RFC 8881) and NFSv4.2's SEEK, ALLOCATE and DEALLOCATE (RFC 7862): the
//!   codec (both halves), a sans-IO state core (clients, sessions and the reply cache, opens and
//!   share reservations, byte-range locks, leases, grace) and the COMPOUND executor
//!   ([`nfs4::server`]) over the same exports and file handles as NFSv3, with a read-only
//!   pseudo file system leading to several exports. [`serve`] answers NFS versions 3 and 4 on
//!   the same ports.
//! - [`drc`]: the duplicate request cache: a non-idempotent call retransmitted after a
//!   reconnect (to a new connection, or over the other transport) gets the reply of its first
//!   execution instead of running twice.
//! - [`exports`]: exports(5) files (several exports, client addresses, networks and `*`, and the
//!   `ro`/`rw`, squash, `anonuid`/`anongid`, `sec=sys`, `fsid=`, `secure`/`insecure` options).
//! - [`gate`]: several exports behind one NFS and one MOUNT program, with the client list
//!   checked and the export's options applied on every call; MNT of any directory at or below
//!   an export; EXPORT listing the real paths and client lists.
//! - [`portmap::Portmapper`]: a port mapper / rpcbind registry served as a program.
//! - [`client`]: NFSv3, MOUNT and port mapper clients over any `oncrpc::RpcTransport`, with
//!   the binding applied (WRITE data and SYMLINK paths DDP-eligible; READ and READLINK calls
//!   announce their reply's Write chunk and maximum size).
//! - [`nfsacl`] and [`client::NfsAclClient`]: NFSACL v3 GETACL (the POSIX ACL side protocol)
//!   types and client; [`ulb::NfsAclBinding`] provisions the GETACL reply and asks again with
//!   a Reply chunk for the largest ACL after RDMA_ERR_CHUNK (short Reply chunk retry, RFC 8267
//!   §3.1, §5.2), once.
//! - [`serve`]: the entry point the CLI uses (NFS + MOUNT + port mapper over TCP), with the
//!   documented place where the RPC-over-RDMA listener joins, and a clean shutdown (calls in
//!   progress finish, exports synced, the write verifier kept for the next start through
//!   [`verifier`]).
//! - Service operation: [`register`] registers with a running system rpcbind instead of our
//!   own port mapper; [`stats`] counts calls per procedure and transport and bytes, and drains
//!   the server at shutdown; [`status`] is the snapshot that [`control`] (the local socket
//!   `oxrdma nfs status` reads) and [`metrics`] (a Prometheus endpoint) report.
//!
//! What it does not do: the NFSv4.0 callback path (RFC 7530 §10.2: the server never connects
//! to the address SETCLIENTID names), NFSv4.1 callbacks over the back channel (CB_NULL, CB_SEQUENCE: no delegations are granted, so
//! none are recalled), delegations, pNFS, named attributes, ACLs, RPCSEC_GSS (and so
//! SP4_MACH_CRED/SP4_SSV), stable storage of NFSv4 client records (every restart is followed by
//! a grace period during which only reclaims are accepted), the RDMA-specific NFSv4 bounds of
//! RFC 8267 §6 (`ca_maxresponsesize` against Write chunks), NFSv4 crossing into an export
//! nested inside another (LOOKUP stays in the outer export, as NFSv3 does), NLM/NSM locking, an
//! NFSACL server (the client and types only; a Linux client without it simply shows mode
//! bits), UDP, or device nodes for non-root callers. MKNOD of devices needs a root caller and
//! a server running as root.

#![forbid(unsafe_code)]

mod xdr_util;

pub mod client;
pub mod control;
pub mod dircache;
pub mod drc;
pub mod exports;
pub mod filecache;
pub mod fsops;
pub mod gate;
pub mod metrics;
pub mod mount;
mod mountd;
pub mod nfs3;
pub mod nfs4;
pub mod nfsacl;
pub mod portmap;
pub mod register;
pub mod serve;
pub mod server;
pub mod stats;
pub mod status;
pub mod ulb;
pub mod verifier;
pub mod vfs;

pub use xdr_util::{Void, decode_exact, encode_to_bytes};
