//! A small torture run over each transport: mixed NFS operations with connection drops from
//! both sides, every outcome checked against the model, the final tree bit-exact.

use std::time::Duration;

use tools::torture::{TortureConfig, Transport, run};

fn small(transport: Transport) {
    let cfg = TortureConfig {
        transport,
        ops: 500,
        drops: 5,
        seed: 7,
        time_limit: Duration::from_secs(100),
        max_file: 64 << 10,
        ..TortureConfig::default()
    };
    let r = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(110), run(&cfg))
                .await
                .expect("torture run timed out")
        })
        .unwrap();
    assert_eq!(r.ops, 500, "{r:#?}");
    assert_eq!(r.completed, 500, "every operation completed: {r:#?}");
    assert_eq!(r.failed, 0, "{r:#?}");
    assert_eq!(r.mismatches, 0, "{:#?}", r.problems);
    assert_eq!(r.final_mismatches, 0, "{:#?}", r.problems);
    assert!(r.files_checked > 0, "{r:#?}");
    assert_eq!(
        r.drops_client + r.drops_server_before + r.drops_server_after,
        5
    );
}

#[test]
fn torture_over_tcp() {
    small(Transport::Tcp);
}

#[test]
fn torture_over_rdma() {
    small(Transport::Rdma);
}
