//! The NFSv4.1/4.2 self test: a session, then files written, committed, read back and
//! compared through OPEN/WRITE/COMMIT/GETATTR/READ/CLOSE/REMOVE, then the session destroyed.

use bytes::Bytes;

use super::SelftestError;
use super::nfs4::{Nfs4Client, Nfs4Error};
use crate::nfs4::consts::stable;
use crate::nfs4::status::Nfsstat4;

/// Round trips against any NFSv4.1 server with [`Nfs4Client`] `c` (the session started):
/// in the root, files of 0, 1, 4095, 4096, 65537 bytes, 1 MiB and `max_mb` MiB are created,
/// written with UNSTABLE WRITEs of 1 MiB, COMMITted, their size checked with GETATTR, read
/// back with READs of 1 MiB and compared, CLOSEd and REMOVEd; a LOOKUP of a removed name must
/// then fail with NFS4ERR_NOENT; last DESTROY_SESSION and DESTROY_CLIENTID. `log` receives one
/// line per step ("OK step ...").
pub async fn selftest4(
    c: Nfs4Client,
    max_mb: usize,
    mut log: impl FnMut(&str),
) -> Result<(), SelftestError> {
    fn fail(step: &str, e: impl std::fmt::Display) -> SelftestError {
        SelftestError {
            step: step.to_string(),
            error: e.to_string(),
        }
    }
    const IO: usize = 1 << 20;
    let root = c.root().await.map_err(|e| fail("putrootfh", e))?;
    log(&format!(
        "OK session minor={} slots={}",
        c.minor(),
        c.slots()
    ));
    let tag = format!("{}.{:08x}", std::process::id(), rand::random::<u32>());
    let mut sizes = vec![0usize, 1, 4095, 4096, 65537, 1 << 20];
    if max_mb > 1 {
        sizes.push(max_mb << 20);
    }
    let mut last = String::new();
    for (i, &len) in sizes.iter().enumerate() {
        let name = format!("oxrdma-selftest4.{tag}.{i}");
        let step = format!("file {len} B");
        let data: Bytes = (0..len)
            .map(|k| (k as u32).wrapping_mul(2_654_435_761).rotate_left(i as u32) as u8)
            .collect::<Vec<u8>>()
            .into();
        let f = c
            .open(&root, name.as_bytes(), Some(0o644))
            .await
            .map_err(|e| fail(&format!("{step}: open"), e))?;
        let mut off = 0;
        while off < len {
            let end = (off + IO).min(len);
            let (n, _, _) = c
                .write(&f, off as u64, data.slice(off..end), stable::UNSTABLE4)
                .await
                .map_err(|e| fail(&format!("{step}: write at {off}"), e))?;
            if n as usize != end - off {
                return Err(fail(
                    &step,
                    format!("WRITE at {off} wrote {n} of {}", end - off),
                ));
            }
            off = end;
        }
        c.commit(&f.fh)
            .await
            .map_err(|e| fail(&format!("{step}: commit"), e))?;
        let size = c
            .size(&f.fh)
            .await
            .map_err(|e| fail(&format!("{step}: getattr"), e))?;
        if size != len as u64 {
            return Err(fail(&step, format!("GETATTR size {size}, wrote {len}")));
        }
        let mut back = Vec::with_capacity(len);
        loop {
            let (d, eof) = c
                .read(&f, back.len() as u64, IO as u32)
                .await
                .map_err(|e| fail(&format!("{step}: read at {}", back.len()), e))?;
            back.extend_from_slice(&d);
            if eof || d.is_empty() {
                break;
            }
        }
        if back != data {
            return Err(fail(
                &step,
                format!("read back {} bytes that differ", back.len()),
            ));
        }
        c.close(&f)
            .await
            .map_err(|e| fail(&format!("{step}: close"), e))?;
        c.remove(&root, name.as_bytes())
            .await
            .map_err(|e| fail(&format!("{step}: remove"), e))?;
        log(&format!(
            "OK {step}: written, committed, read back, removed"
        ));
        last = name;
    }
    match c.lookup(&root, last.as_bytes()).await {
        Err(Nfs4Error::Status {
            status: Nfsstat4::NOENT,
            ..
        }) => log("OK lookup of a removed file: NOENT"),
        other => return Err(fail("lookup removed", format!("{other:?}"))),
    }
    c.destroy().await.map_err(|e| fail("destroy", e))?;
    log("OK destroy_session destroy_clientid");
    Ok(())
}
