//! Interoperability with libtirpc's `rpcinfo` (Debian package `rpcbind`): a NULL call over TCP
//! to our server, and the PROG_MISMATCH reply for a version we do not serve.
//!
//! Skips, with a printed reason, when `rpcinfo` is not installed.

use std::path::PathBuf;
use std::sync::Arc;

use oncrpc::{Dispatcher, ServerConfig, TcpServer, null_program};

const PROG: u32 = 0x2000_0099;

fn rpcinfo() -> Option<PathBuf> {
    ["/usr/sbin/rpcinfo", "/usr/bin/rpcinfo", "/sbin/rpcinfo"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

async fn run_rpcinfo(bin: PathBuf, port: u16, vers: u32) -> (bool, String) {
    // libtirpc's `rpcinfo -n PORT -t HOST ...` still asks the portmapper on port 111 first
    // (seen with strace: connect to 127.0.0.1:111, then "Connection refused" when rpcbind is not
    // running). `-a UADDR -T tcp` takes the service's universal address (RFC 5665 form
    // "h1.h2.h3.h4.p1.p2") and calls it directly, so no rpcbind is needed.
    let uaddr = format!("127.0.0.1.{}.{}", port >> 8, port & 0xff);
    // rpcinfo blocks, so it runs on the blocking pool while the server keeps serving.
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(bin)
            .args([
                "-a",
                &uaddr,
                "-T",
                "tcp",
                &PROG.to_string(),
                &vers.to_string(),
            ])
            .stdin(std::process::Stdio::null())
            .output()
    })
    .await
    .expect("rpcinfo task")
    .expect("rpcinfo ran");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

async fn server() -> TcpServer {
    let d = Dispatcher::new().with(null_program(PROG, 1, 3));
    TcpServer::bind("127.0.0.1:0", Arc::new(d), ServerConfig::default())
        .await
        .unwrap()
}

#[tokio::test]
async fn rpcinfo_null_call_succeeds() {
    let Some(bin) = rpcinfo() else {
        println!("SKIP: rpcinfo not installed (apt-get install rpcbind)");
        return;
    };
    let server = server().await;
    let (ok, text) = run_rpcinfo(bin, server.local_addr().port(), 2).await;
    println!("{text}");
    assert!(ok, "rpcinfo failed: {text}");
    assert!(text.contains("ready and waiting"), "{text}");
    server.shutdown().await;
}

#[tokio::test]
async fn rpcinfo_reports_prog_mismatch_range() {
    let Some(bin) = rpcinfo() else {
        println!("SKIP: rpcinfo not installed (apt-get install rpcbind)");
        return;
    };
    let server = server().await;
    let (ok, text) = run_rpcinfo(bin, server.local_addr().port(), 9).await;
    println!("{text}");
    assert!(!ok, "rpcinfo should fail for version 9: {text}");
    // libtirpc prints the server's version range from the PROG_MISMATCH reply.
    assert!(text.contains("low version = 1"), "{text}");
    assert!(text.contains("high version = 3"), "{text}");
    server.shutdown().await;
}
