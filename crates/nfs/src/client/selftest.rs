//! The end-to-end self test: MOUNT, then every NFSv3 procedure against a live server.

use bytes::Bytes;

use super::Nfs3Client;
use crate::nfs3::*;

/// A failed [`selftest`] step.
#[derive(Debug, thiserror::Error)]
#[error("selftest step {step} failed: {error}")]
pub struct SelftestError {
    /// The step's name.
    pub step: String,
    /// What went wrong.
    pub error: String,
}

/// Round trips against any NFSv3 server (the same ones the interop lab's
/// `guest/nfs-roundtrip.sh` makes through the kernel client): in a fresh directory under
/// `root`, files of 0, 1, 4095, 4096, 65537 bytes, 1 MiB and `max_mb` MiB are written with
/// UNSTABLE WRITEs of the server's preferred size, COMMITted, read back and compared; then
/// READDIRPLUS, GETATTR, MKDIR, RENAME, SYMLINK/READLINK, REMOVE and RMDIR, and a final LOOKUP
/// that must fail with NOENT. `log` receives one line per step ("OK step ..."). Everything
/// created is removed again on success.
pub async fn selftest(
    c: &Nfs3Client,
    root: &Fh3,
    max_mb: usize,
    mut log: impl FnMut(&str),
) -> Result<(), SelftestError> {
    fn fail(step: &str, e: impl std::fmt::Display) -> SelftestError {
        SelftestError {
            step: step.to_string(),
            error: e.to_string(),
        }
    }
    let info = c
        .fsinfo(root)
        .await
        .and_then(Res::into_result)
        .map_err(|e| fail("fsinfo", e))?;
    let wsize = info.wtpref.clamp(4096, 1 << 20) as usize;
    let rsize = info.rtpref.clamp(4096, 1 << 20);
    log(&format!(
        "OK fsinfo rtpref={} wtpref={}",
        info.rtpref, info.wtpref
    ));
    let dname = format!(
        "oxrdma-selftest.{}.{:08x}",
        std::process::id(),
        rand::random::<u32>()
    );
    let d = c
        .mkdir(root, dname.as_bytes(), 0o755)
        .await
        .and_then(Res::into_result)
        .map_err(|e| fail("mkdir", e))?
        .obj
        .ok_or_else(|| fail("mkdir", "no handle returned"))?;
    log(&format!("OK mkdir {dname}"));
    let mut sizes = vec![0usize, 1, 4095, 4096, 65537, 1 << 20];
    if max_mb > 1 {
        sizes.push(max_mb << 20);
    }
    let mut files = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let step = format!("write-{n}");
        let name = format!("f.{n}");
        let fh = c
            .create(
                &d,
                name.as_bytes(),
                CreateHow3::Unchecked(Sattr3 {
                    mode: Some(0o644),
                    ..Sattr3::default()
                }),
            )
            .await
            .and_then(Res::into_result)
            .map_err(|e| fail(&step, e))?
            .obj
            .ok_or_else(|| fail(&step, "no handle returned"))?;
        let data = selftest_data(n, i as u32);
        c.write_all(&fh, &data, wsize)
            .await
            .map_err(|e| fail(&step, e))?;
        log(&format!("OK {step}"));
        files.push((name, fh, data));
    }
    for (name, fh, data) in &files {
        let step = format!("read-cmp-{}", data.len());
        let back = c.read_all(fh, rsize).await.map_err(|e| fail(&step, e))?;
        if back.len() != data.len() || back[..] != data[..] {
            let at = back.iter().zip(data.iter()).position(|(a, b)| a != b);
            return Err(fail(
                &step,
                format!(
                    "{name}: {} bytes back, first difference at {at:?}",
                    back.len()
                ),
            ));
        }
        log(&format!("OK {step}"));
    }
    let entries = c
        .readdirplus_all(&d)
        .await
        .map_err(|e| fail("readdirplus", e))?;
    let n = entries
        .iter()
        .filter(|e| e.name.as_bytes().starts_with(b"f."))
        .count();
    if n != sizes.len() {
        return Err(fail(
            "readdirplus",
            format!("{n} files listed, {} expected", sizes.len()),
        ));
    }
    log(&format!("OK readdirplus {} entries", entries.len()));
    let f65537 = &files[4].1;
    let a = c
        .getattr(f65537)
        .await
        .and_then(Res::into_result)
        .map_err(|e| fail("stat-size", e))?;
    if a.obj_attributes.size != 65537 {
        return Err(fail("stat-size", format!("size {}", a.obj_attributes.size)));
    }
    log("OK stat-size");
    let sub = c
        .mkdir(&d, b"sub", 0o755)
        .await
        .and_then(Res::into_result)
        .map_err(|e| fail("mkdir-sub", e))?
        .obj
        .ok_or_else(|| fail("mkdir-sub", "no handle returned"))?;
    log("OK mkdir-sub");
    c.rename(&d, b"f.4096", &sub, b"renamed")
        .await
        .and_then(Res::into_result)
        .map_err(|e| fail("rename", e))?;
    let moved = c
        .lookup(&sub, b"renamed")
        .await
        .and_then(Res::into_result)
        .map_err(|e| fail("rename-check", e))?;
    let back = c
        .read_all(&moved.object, rsize)
        .await
        .map_err(|e| fail("rename-check", e))?;
    if back[..] != files[3].2[..] {
        return Err(fail("rename-check", "contents differ after rename"));
    }
    log("OK rename");
    let ln = c
        .symlink(&d, b"link", b"sub/renamed")
        .await
        .and_then(Res::into_result)
        .map_err(|e| fail("symlink", e))?
        .obj
        .ok_or_else(|| fail("symlink", "no handle returned"))?;
    let rl = c
        .readlink(&ln)
        .await
        .and_then(Res::into_result)
        .map_err(|e| fail("readlink", e))?;
    if rl.data.as_bytes() != b"sub/renamed" {
        return Err(fail(
            "readlink",
            format!("{:?}", String::from_utf8_lossy(rl.data.as_bytes())),
        ));
    }
    log("OK symlink/readlink");
    let rm = |dir: Fh3, name: Vec<u8>| async move {
        c.remove(&dir, &name)
            .await
            .and_then(Res::into_result)
            .map(drop)
    };
    rm(d.clone(), b"link".to_vec())
        .await
        .map_err(|e| fail("rm", e))?;
    rm(sub.clone(), b"renamed".to_vec())
        .await
        .map_err(|e| fail("rm", e))?;
    for (name, _, _) in &files {
        if name != "f.4096" {
            rm(d.clone(), name.clone().into_bytes())
                .await
                .map_err(|e| fail("rm", e))?;
        }
    }
    log("OK rm");
    c.rmdir(&d, b"sub")
        .await
        .and_then(Res::into_result)
        .map_err(|e| fail("rmdir", e))?;
    c.rmdir(root, dname.as_bytes())
        .await
        .and_then(Res::into_result)
        .map_err(|e| fail("rmdir", e))?;
    log("OK rmdir");
    match c
        .lookup(root, dname.as_bytes())
        .await
        .map_err(|e| fail("gone", e))?
        .status()
    {
        Nfsstat3::NoEnt => log("OK gone"),
        s => return Err(fail("gone", format!("LOOKUP after RMDIR gave {s}"))),
    }
    Ok(())
}

/// Deterministic test data that does not repeat every 4 KiB (xorshift).
fn selftest_data(len: usize, seed: u32) -> Bytes {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    Bytes::from(v)
}
