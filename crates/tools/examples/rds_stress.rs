//! Measures rds-stress style request/ack over RDS/TCP on loopback (127.0.0.1 → 127.0.0.2) and
//! the raw-TCP baseline with the same sizes:
//! `cargo run --release -p tools --example rds_stress -- -q 8192 -a 256 -d 4 -t 2 -T 3 [-p paths]`

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use rds::{RdsStack, StackConfig};
use tools::rds::{StressParams, StressResult};

fn row(name: &str, r: &StressResult) {
    println!(
        "{name:>6} {:>4} {:>10.0} {:>10.0} {:>12.0} {:>8.0} {:>8.0} {:>9.1}",
        r.tasks,
        r.tx_per_s,
        r.rx_per_s,
        r.tx_rx_kib_per_s,
        r.mbi_kib_per_s,
        r.mbo_kib_per_s,
        r.rtt_us
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut p = StressParams::default();
    let mut paths = 8u16;
    let args: Vec<String> = std::env::args().skip(1).collect();
    for w in args.chunks(2) {
        let v = w.get(1).map(String::as_str).unwrap_or("");
        match w[0].as_str() {
            "-q" => p.req_size = v.parse()?,
            "-a" => p.ack_size = v.parse()?,
            "-d" => p.depth = v.parse()?,
            "-t" => p.tasks = v.parse()?,
            "-T" => p.duration = Duration::from_secs_f64(v.parse()?),
            "-p" => paths = v.parse()?,
            o => return Err(format!("unknown option {o}").into()),
        }
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut ca = StackConfig::new(Ipv4Addr::new(127, 0, 0, 1));
    ca.tcp_port = port;
    ca.max_paths = paths;
    let mut cb = StackConfig::new(Ipv4Addr::new(127, 0, 0, 2));
    cb.tcp_port = port;
    cb.max_paths = paths;
    let a = RdsStack::start(ca).await?;
    let b = RdsStack::start(cb).await?;
    let _srv = tools::rds::stress_server(&b, 9000, p.tasks, p.ack_size)?;
    println!("{p:?}, paths {paths}");
    println!(
        "{:>6} {:>4} {:>10} {:>10} {:>12} {:>8} {:>8} {:>9}",
        "", "tsks", "tx/s", "rx/s", "tx+rx K/s", "mbi K/s", "mbo K/s", "rtt us"
    );
    let r = tools::rds::stress_client(&a, SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 2), 9000), p)
        .await?;
    row("rds", &r);
    let (_h, addr) = tools::rds::tcp_baseline_server("127.0.0.2:0".parse()?).await?;
    let t = tools::rds::tcp_baseline_client(addr, p).await?;
    row("tcp", &t);
    let info = a.info();
    for c in &info.conns {
        println!(
            "peer {} npaths {:?} paths up {}",
            c.peer,
            c.npaths,
            c.paths.len()
        );
    }
    Ok(())
}
