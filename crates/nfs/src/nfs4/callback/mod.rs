//! NFSv4.1 callbacks (RFC 8881 §20): the back channel's wire formats ([`wire`]) and the
//! client half that answers them ([`program`]). The server half is split the sans-IO way:
//! the state core decides that a callback is due and what it says
//! (`state::State::take_callbacks`, in `state/callbacks.rs`), and the server's driver sends it
//! on the connection the client granted as back channel (`server/callbacks.rs`), over
//! RPC-over-RDMA as an RFC 8167 backward call or over TCP on the same stream.

pub mod program;
pub mod wire;
