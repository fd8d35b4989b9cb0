//! pynfs, the Linux NFS community's NFSv4.1 server suite (`../shared/thirdparty/pynfs`), run
//! against `oxrdma nfs serve` over TCP: every test of its `all` set except the groups the
//! server does not implement (`xattr`: RFC 8276 extended attributes; `deleg`: delegations, which
//! the server never grants) and the `courteous` group (each of its tests waits out two leases,
//! minutes of sleeping). Every test run must pass.
//!
//! Skips, with the reason printed, when the pynfs tree, `python3` or its `ply` module (Debian
//! `python3-ply`) is missing. Set `OXRDMA_PYNFS` to use another pynfs tree, and
//! `OXRDMA_PYNFS_TESTS` (space-separated pynfs codes or flags) to run other tests.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The whole run's limit: pynfs's own tests have no overall timeout.
const RUN_LIMIT: Duration = Duration::from_secs(900);
/// Fewer passing tests than this means the run did not really happen (a broken build of
/// pynfs, a flag that selects nothing), not that the server is good.
const MIN_PASSED: u64 = 100;

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn pynfs_tree() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("OXRDMA_PYNFS") {
        return Some(PathBuf::from(p));
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/thirdparty/pynfs");
    p.join("nfs4.1/testserver.py").exists().then_some(p)
}

/// The first Python 3 that has `ply`: the one on PATH, or the system's (a pyenv or venv
/// python3 on PATH does not see Debian's python3-ply).
fn python_with_ply() -> Result<PathBuf, String> {
    let mut why = Vec::new();
    for py in ["python3", "/usr/bin/python3"] {
        match Command::new(py).args(["-c", "import ply"]).output() {
            Ok(o) if o.status.success() => return Ok(PathBuf::from(py)),
            Ok(_) => why.push(format!("{py} has no `ply` module")),
            Err(e) => why.push(format!("no {py} ({e})")),
        }
    }
    Err(format!("{} (Debian: python3-ply)", why.join("; ")))
}

/// Copies the (possibly read-only) tree to `dst`, making every copy writable: pynfs's build
/// writes generated XDR code beside its sources.
fn copy_tree(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let to = dst.join(e.file_name());
        let t = e.file_type().unwrap();
        if t.is_dir() {
            copy_tree(&e.path(), &to);
        } else if t.is_file() {
            std::fs::copy(e.path(), &to).unwrap();
            let mut perm = std::fs::metadata(&to).unwrap().permissions();
            #[allow(clippy::permissions_set_readonly_false)]
            perm.set_readonly(false);
            std::fs::set_permissions(&to, perm).unwrap();
        }
    }
}

/// An interpreter's absolute path (a bare name is looked up on PATH).
fn which(p: &Path) -> Option<PathBuf> {
    if p.is_absolute() {
        return Some(p.to_path_buf());
    }
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(p))
        .find(|c| c.is_file())
}

/// Starts `oxrdma nfs serve` on an ephemeral TCP port; returns it with its `host:port`.
fn serve(dir: &Path) -> (Running, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_oxrdma"))
        .args(["nfs", "serve"])
        .arg(dir)
        .args([
            "--tcp",
            "127.0.0.1:0",
            "--no-rdma",
            "--no-portmap",
            "--nfs4-grace",
            "0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn oxrdma nfs serve");
    let out = child.stdout.take().expect("piped stdout");
    let running = Running(child);
    let mut rd = BufReader::new(out);
    loop {
        let mut l = String::new();
        let n = rd.read_line(&mut l).expect("read stdout");
        assert!(n > 0, "nfs serve exited before printing ADDRS");
        if let Some(rest) = l.strip_prefix("ADDRS ") {
            let nfs = rest
                .split_whitespace()
                .find_map(|kv| kv.strip_prefix("nfs=tcp://"))
                .expect("ADDRS has nfs=tcp://")
                .to_string();
            // Keep reading stdout so the server never blocks on a full pipe.
            std::thread::spawn(move || {
                let mut sink = String::new();
                while rd.read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {
                    sink.clear();
                }
            });
            return (running, nfs);
        }
    }
}

#[test]
fn pynfs_nfsv41_suite_passes() {
    let Some(tree) = pynfs_tree() else {
        println!("SKIP: no pynfs tree (../shared/thirdparty/pynfs; or set OXRDMA_PYNFS)");
        return;
    };
    let python = match python_with_ply() {
        Ok(p) => p,
        Err(why) => {
            println!("SKIP: {why}");
            return;
        }
    };
    let work = tempfile::tempdir().unwrap();
    // pynfs's setup.py runs `python3` from PATH for each of its parts: make that this one.
    let bin = work.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let py = which(&python).expect("resolve python3");
    std::os::unix::fs::symlink(&py, bin.join("python3")).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let pynfs = work.path().join("pynfs");
    copy_tree(&tree, &pynfs);
    let build = Command::new(&py)
        .env("PATH", &path)
        .arg("setup.py")
        .arg("build")
        .current_dir(&pynfs)
        .output()
        .expect("run pynfs setup.py");
    assert!(build.status.success(), "pynfs build failed: {build:?}");

    let export = work.path().join("export");
    std::fs::create_dir(&export).unwrap();
    let (_server, addr) = serve(&export);

    let tests = std::env::var("OXRDMA_PYNFS_TESTS")
        .unwrap_or_else(|_| "all noxattr nodeleg nocourteous".to_string());
    let mut run = Command::new(&py)
        .env("PATH", &path)
        .arg("testserver.py")
        .arg(format!("{addr}/"))
        .args(["--maketree", "--rundeps"])
        .args(tests.split_whitespace())
        .current_dir(pynfs.join("nfs4.1"))
        // Files, not pipes: a full pipe would stall pynfs until the time limit.
        .stdout(std::fs::File::create(work.path().join("pynfs.out")).unwrap())
        .stderr(std::fs::File::create(work.path().join("pynfs.err")).unwrap())
        .spawn()
        .expect("run pynfs testserver.py");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = run.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > RUN_LIMIT {
            let _ = run.kill();
            panic!("pynfs did not finish within {RUN_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let stdout = std::fs::read_to_string(work.path().join("pynfs.out")).unwrap_or_default();
    let failed: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains(": FAILURE") || l.contains(": WARNING"))
        .collect();
    let tail: Vec<&str> = stdout.lines().rev().take(4).collect();
    println!("pynfs ({tests}) in {:?}: {tail:?}", start.elapsed());
    assert!(
        status.success(),
        "pynfs exited with {status}: {}",
        std::fs::read_to_string(work.path().join("pynfs.err")).unwrap_or_default()
    );

    // pynfs's own summary: "Of those: S Skipped, F Failed, W Warned, P Passed".
    let summary = stdout
        .lines()
        .find_map(|l| l.strip_prefix("Of those: "))
        .expect("pynfs printed its summary line");
    let count = |what: &str| -> u64 {
        summary
            .split(", ")
            .find_map(|part| part.strip_suffix(what)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {what} count in {summary:?}"))
    };
    let (failed_n, warned, passed) = (count(" Failed"), count(" Warned"), count(" Passed"));
    println!("pynfs: {summary}");
    assert_eq!(failed_n, 0, "pynfs failures: {failed:#?}");
    assert!(
        passed >= MIN_PASSED,
        "only {passed} pynfs tests passed: the run selected too little"
    );
    if warned > 0 {
        println!("pynfs warnings: {failed:#?}");
    }
}
