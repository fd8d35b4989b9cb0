//! Bounds on the scratch exports the NFS server targets write into (shared by `nfs_server_args`
//! and `nfs4_compound` through `#[path]`).
//!
//! A fuzzed client may WRITE at any offset or ALLOCATE any length, and the server does what it
//! is asked: two campaigns filled the machine's disk (31 GB through NFSv3 WRITEs, 65 GB in 30 s
//! through NFSv4.2 ALLOCATE). The process's file size limit makes such calls fail with EFBIG
//! (NFS3ERR_FBIG / NFS4ERR_FBIG, which the targets accept like any other status), and the
//! periodic wipe keeps the number of files small.

use std::path::Path;

/// Largest file the target's process may create or extend.
pub const MAX_FILE: u64 = 16 << 20;

/// Cap every file this process writes at [`MAX_FILE`] bytes, and have the kernel fail the
/// write with EFBIG instead of sending SIGXFSZ.
pub fn limit_file_size() {
    // SAFETY: `signal` with SIG_IGN installs no handler code, and `setrlimit` reads a plain
    // struct that lives for the call; neither touches memory Rust owns.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        let lim = libc::rlimit {
            rlim_cur: MAX_FILE,
            rlim_max: MAX_FILE,
        };
        libc::setrlimit(libc::RLIMIT_FSIZE, &lim);
    }
}

/// Remove what the fuzzer created at the top of `root` and in `root/sub` (keeping `sub`,
/// `sub/file` and `ln`), and cut `sub/file` back to its ten bytes.
pub fn wipe(root: &Path) {
    for dir in [root.to_path_buf(), root.join("sub")] {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let n = e.file_name();
            if n != "sub" && n != "ln" && n != "file" {
                let p = e.path();
                let _ = std::fs::remove_file(&p).or_else(|_| std::fs::remove_dir_all(&p));
            }
        }
    }
    if let Ok(f) = std::fs::OpenOptions::new()
        .write(true)
        .open(root.join("sub/file"))
    {
        let _ = f.set_len(10);
    }
}
