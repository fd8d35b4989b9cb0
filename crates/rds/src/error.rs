//! Typed errors of the rds crate.

/// Errors from the wire decoders and encoders.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Not enough bytes.
    #[error("need {need} bytes, have {have}")]
    Short {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// `h_csum` is nonzero and the header does not sum to zero.
    #[error("bad header checksum {0:#06x}")]
    BadChecksum(u16),
    /// `h_len` larger than 1 MiB.
    #[error("message length {0} exceeds 1 MiB")]
    TooLong(u32),
    /// Extensions do not fit the 16-byte area.
    #[error("extensions need {0} bytes, the header has 16")]
    ExtensionsTooLong(usize),
    /// A congestion map payload that is not 8192 bytes.
    #[error("congestion map of {0} bytes, want 8192")]
    BadCongMapLen(usize),
    /// An RDS/RDMA fragment whose seq, len or ports differ from its message's first fragment,
    /// or that overruns the message.
    #[error("fragment does not match its message")]
    FragmentMismatch,
}

/// Errors returned to senders.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// Payload larger than 1 MiB (Linux: EMSGSIZE).
    #[error("message of {0} bytes exceeds 1 MiB")]
    TooLong(usize),
    /// The source port is not bound on this stack (Linux: ENOTCONN).
    #[error("port {0} is not bound")]
    NotBound(u16),
    /// The destination port is marked congested by the peer (Linux: ENOBUFS/EAGAIN); retry once
    /// the peer's congestion map clears it.
    #[error("destination port is congested")]
    Congested,
    /// The port's send buffer is full of queued and unconfirmed messages (Linux: EAGAIN for a
    /// non-blocking send; a blocking send waits).
    #[error("send buffer full")]
    SendBufferFull,
    /// The multipath probe has not been answered yet (Linux: EAGAIN for non-blocking sends).
    #[error("connection handshake (multipath probe) pending")]
    HandshakePending,
    /// Destination port 0 is reserved for pings; use the ping API.
    #[error("invalid destination")]
    InvalidDestination,
    /// The stack is shut down.
    #[error("stack shut down")]
    Shutdown,
    /// A new destination, and the stack already holds state for its bound of peers, each of
    /// which carried messages (`EngineConfig::max_peers`; Linux: ENOBUFS).
    #[error("already connected to {0} peers (the max_peers bound); no room for another")]
    TooManyPeers(usize),
    /// RDMA operations need an RDS over RDMA stack (Linux: EOPNOTSUPP on rds_tcp).
    #[error("RDMA operations need an RDS over RDMA stack")]
    NotRdma,
    /// The RDMA operation did not complete: the connection failed before or while it ran
    /// (Linux does not re-issue RDMA operations on a new connection).
    #[error("the RDMA operation did not complete")]
    RdmaFailed,
}

impl SendError {
    /// Whether retrying later can succeed (the Linux EAGAIN class).
    pub fn is_would_block(&self) -> bool {
        matches!(
            self,
            SendError::Congested | SendError::HandshakePending | SendError::SendBufferFull
        )
    }

    /// Closest errno, as Linux's `sendmsg` on a PF_RDS socket reports it.
    pub fn errno(&self) -> i32 {
        match self {
            SendError::TooLong(_) => libc::EMSGSIZE,
            SendError::NotBound(_) => libc::ENOTCONN,
            SendError::Congested | SendError::TooManyPeers(_) => libc::ENOBUFS,
            SendError::HandshakePending | SendError::SendBufferFull => libc::EAGAIN,
            SendError::InvalidDestination => libc::EINVAL,
            SendError::Shutdown => libc::EPIPE,
            SendError::NotRdma => libc::EOPNOTSUPP,
            SendError::RdmaFailed => libc::EIO,
        }
    }
}

/// Errors from binding or the stack.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RdsError {
    /// The RDS port is already bound on this address (EADDRINUSE).
    #[error("RDS port {0} already bound")]
    AddrInUse(u16),
    /// A send failed.
    #[error(transparent)]
    Send(#[from] SendError),
    /// An I/O error of the transport.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The stack has shut down.
    #[error("stack shut down")]
    Shutdown,
    /// A peer broke the protocol.
    #[error(transparent)]
    Wire(#[from] WireError),
}
