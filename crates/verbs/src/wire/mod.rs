//! iWARP wire formats: MPA (RFC 5044/6581), DDP (RFC 5041) and RDMAP (RFC 5040).
//!
//! Every decoder here is checked: it never panics, whatever the input, and returns a
//! [`WireError`]. Structs are plain data with `encode` / `decode` / `encoded_len`.

pub mod ddp;
pub mod mpa;

/// Decode errors for the iWARP wire formats.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Input shorter than the structure.
    #[error("truncated: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// The MPA key was neither the Request nor the Reply key.
    #[error("bad MPA key")]
    BadMpaKey,
    /// Unsupported MPA revision.
    #[error("unsupported MPA revision {0}")]
    BadMpaRevision(u8),
    /// Private data length over the limit.
    #[error("private data too long: {0} bytes")]
    PrivateDataTooLong(usize),
    /// MPA CRC-32C mismatch.
    #[error("MPA CRC mismatch")]
    CrcMismatch,
    /// DDP version other than 1.
    #[error("bad DDP version {0}")]
    BadDdpVersion(u8),
    /// RDMAP version other than 1.
    #[error("bad RDMAP version {0}")]
    BadRdmapVersion(u8),
    /// Opcode not defined by RFC 5040 (or not valid for the buffer model).
    #[error("bad RDMAP opcode {0}")]
    BadOpcode(u8),
}
