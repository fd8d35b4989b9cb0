//! Command groups, one module each.

pub mod decode;
pub mod iwarp;
pub mod nfs;
pub mod nfs_bench;
pub mod perf;
pub mod rds;
pub mod rds_peer;
pub mod rpc;
pub mod torture;

/// What every command returns: errors are printed by `main` and give exit status 1.
pub type CmdResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Parse a number given in decimal or as `0x` hexadecimal (RPC program numbers are usually
/// written in hex).
pub fn parse_u32(s: &str) -> Result<u32, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("{s:?} is not a 32-bit number: {e}"))
}

/// Wait for Ctrl-C (SIGINT) or SIGTERM.
pub async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
