//! One operation at a time against the server, each outcome checked against the model, and the
//! final read-back.

use std::collections::BTreeSet;
use std::path::Path;

use bytes::Bytes;
use nfs::client::{ClientError, Nfs3Client};
use nfs::nfs3::{CreateHow3, Fh3, Ftype3, Nfsstat3, Sattr3, SetattrArgs, StableHow};
use rand::Rng;
use rand::rngs::StdRng;

use super::TortureReport;
use super::model::{Inode, Model, Node, name, pattern};

pub(super) struct Run<'a> {
    pub(super) c: Nfs3Client,
    pub(super) root: Fh3,
    pub(super) m: Model,
    pub(super) rng: StdRng,
    pub(super) max_file: usize,
    pub(super) report: &'a mut TortureReport,
}

pub(super) type Outcome3<T> = Result<(Nfsstat3, Option<T>), ClientError>;

pub(super) fn status<T, F>(r: Result<nfs::nfs3::Res<T, F>, ClientError>) -> Outcome3<T> {
    r.map(|res| match res {
        nfs::nfs3::Res::Ok(t) => (Nfsstat3::Ok, Some(t)),
        nfs::nfs3::Res::Err(s, _) => (s, None),
    })
}

impl Run<'_> {
    pub(super) fn problem(&mut self, what: String) {
        if self.report.problems.len() < 20 {
            self.report.problems.push(what);
        }
    }

    fn expect(&mut self, op: &str, want: Nfsstat3, got: Nfsstat3) -> bool {
        if want != got {
            self.report.mismatches += 1;
            self.problem(format!("{op}: expected {want}, got {got}"));
            false
        } else {
            true
        }
    }

    /// One random operation. `Err` when the call failed at the RPC level.
    pub(super) async fn step(&mut self) -> Result<(), ClientError> {
        let kind = self.rng.random_range(0..100u32);
        let (label, res) = match kind {
            0..=11 => ("CREATE", self.create().await),
            12..=16 => ("MKDIR", self.mkdir().await),
            17..=20 => ("RMDIR", self.rmdir().await),
            21..=30 => ("REMOVE", self.remove().await),
            31..=37 => ("RENAME", self.rename().await),
            38..=41 => ("LINK", self.link().await),
            42..=45 => ("SYMLINK", self.symlink().await),
            46..=50 => ("SETATTR", self.truncate().await),
            51..=70 => ("WRITE", self.write().await),
            71..=82 => ("READ", self.read().await),
            83..=88 => ("GETATTR", self.getattr().await),
            89..=96 => ("LOOKUP", self.lookup().await),
            _ => ("READDIRPLUS", self.readdir().await),
        };
        *self.report.by_kind.entry(label).or_default() += 1;
        res
    }

    async fn create(&mut self) -> Result<(), ClientError> {
        let n = name(&mut self.rng);
        let how = CreateHow3::Guarded(Sattr3 {
            mode: Some(0o644),
            ..Sattr3::default()
        });
        let (s, ok) = status(self.c.create(&self.root, n.as_bytes(), how).await)?;
        let want = if self.m.names.contains_key(&n) {
            Nfsstat3::Exist
        } else {
            Nfsstat3::Ok
        };
        if self.expect(&format!("CREATE {n}"), want, s) && s == Nfsstat3::Ok {
            match ok.and_then(|o| o.obj) {
                Some(fh) => {
                    let ino = self.m.next_ino;
                    self.m.next_ino += 1;
                    self.m.inodes.insert(
                        ino,
                        Inode {
                            data: Vec::new(),
                            fh,
                        },
                    );
                    self.m.names.insert(n, Node::File(ino));
                }
                None => {
                    self.report.mismatches += 1;
                    self.problem(format!("CREATE {n}: no handle"));
                }
            }
        }
        Ok(())
    }

    async fn mkdir(&mut self) -> Result<(), ClientError> {
        let n = name(&mut self.rng);
        let (s, _) = status(self.c.mkdir(&self.root, n.as_bytes(), 0o755).await)?;
        let want = if self.m.names.contains_key(&n) {
            Nfsstat3::Exist
        } else {
            Nfsstat3::Ok
        };
        if self.expect(&format!("MKDIR {n}"), want, s) && s == Nfsstat3::Ok {
            self.m.names.insert(n, Node::Dir);
        }
        Ok(())
    }

    /// A name that is not a directory (or absent), for REMOVE, RENAME and friends.
    fn non_dir(&mut self) -> String {
        for _ in 0..8 {
            let n = name(&mut self.rng);
            if !matches!(self.m.names.get(&n), Some(Node::Dir)) {
                return n;
            }
        }
        // Every try hit a directory: a name outside the pool, absent.
        "absent".to_string()
    }

    async fn rmdir(&mut self) -> Result<(), ClientError> {
        // A directory or an absent name.
        let mut n = name(&mut self.rng);
        for _ in 0..8 {
            if matches!(self.m.names.get(&n), None | Some(Node::Dir)) {
                break;
            }
            n = name(&mut self.rng);
        }
        if !matches!(self.m.names.get(&n), None | Some(Node::Dir)) {
            n = "absent".into();
        }
        let (s, _) = status(self.c.rmdir(&self.root, n.as_bytes()).await)?;
        let want = if self.m.names.contains_key(&n) {
            Nfsstat3::Ok
        } else {
            Nfsstat3::NoEnt
        };
        if self.expect(&format!("RMDIR {n}"), want, s) && s == Nfsstat3::Ok {
            self.m.names.remove(&n);
        }
        Ok(())
    }

    async fn remove(&mut self) -> Result<(), ClientError> {
        let n = self.non_dir();
        let (s, _) = status(self.c.remove(&self.root, n.as_bytes()).await)?;
        let want = if self.m.names.contains_key(&n) {
            Nfsstat3::Ok
        } else {
            Nfsstat3::NoEnt
        };
        if self.expect(&format!("REMOVE {n}"), want, s) && s == Nfsstat3::Ok {
            self.m.unlink(&n);
        }
        Ok(())
    }

    async fn rename(&mut self) -> Result<(), ClientError> {
        let a = self.non_dir();
        let b = self.non_dir();
        let (s, _) = status(
            self.c
                .rename(&self.root, a.as_bytes(), &self.root, b.as_bytes())
                .await,
        )?;
        let want = if self.m.names.contains_key(&a) {
            Nfsstat3::Ok
        } else {
            Nfsstat3::NoEnt
        };
        if self.expect(&format!("RENAME {a} {b}"), want, s) && s == Nfsstat3::Ok && a != b {
            // RFC 1813 §3.3.14: renaming one hard link of a file over another is a no-op.
            let same = matches!(
                (self.m.names.get(&a), self.m.names.get(&b)),
                (Some(Node::File(x)), Some(Node::File(y))) if x == y
            );
            if !same {
                let node = self.m.names.remove(&a);
                self.m.unlink(&b);
                if let Some(node) = node {
                    self.m.names.insert(b, node);
                }
            }
        }
        Ok(())
    }

    async fn link(&mut self) -> Result<(), ClientError> {
        let files = self.m.files();
        if files.is_empty() {
            return self.create().await;
        }
        let src = files[self.rng.random_range(0..files.len())].clone();
        let n = name(&mut self.rng);
        let Some(Node::File(ino)) = self.m.names.get(&src).cloned() else {
            return self.create().await;
        };
        let fh = self.m.inodes[&ino].fh.clone();
        let (s, _) = status(self.c.link(&fh, &self.root, n.as_bytes()).await)?;
        let want = if self.m.names.contains_key(&n) {
            Nfsstat3::Exist
        } else {
            Nfsstat3::Ok
        };
        if self.expect(&format!("LINK {src} {n}"), want, s) && s == Nfsstat3::Ok {
            self.m.names.insert(n, Node::File(ino));
        }
        Ok(())
    }

    async fn symlink(&mut self) -> Result<(), ClientError> {
        let n = name(&mut self.rng);
        let target = format!("target-{}", self.rng.random_range(0..1000u32)).into_bytes();
        let (s, _) = status(self.c.symlink(&self.root, n.as_bytes(), &target).await)?;
        let want = if self.m.names.contains_key(&n) {
            Nfsstat3::Exist
        } else {
            Nfsstat3::Ok
        };
        if self.expect(&format!("SYMLINK {n}"), want, s) && s == Nfsstat3::Ok {
            self.m.names.insert(n, Node::Link(target));
        }
        Ok(())
    }

    fn pick_file(&mut self) -> Option<(String, u64)> {
        let files = self.m.files();
        if files.is_empty() {
            return None;
        }
        let n = files[self.rng.random_range(0..files.len())].clone();
        match self.m.names.get(&n) {
            Some(Node::File(i)) => Some((n, *i)),
            _ => None,
        }
    }

    async fn truncate(&mut self) -> Result<(), ClientError> {
        let Some((n, ino)) = self.pick_file() else {
            return self.create().await;
        };
        let size = self.rng.random_range(0..=self.max_file as u64 / 2);
        let fh = self.m.inodes[&ino].fh.clone();
        let (s, _) = status(
            self.c
                .setattr(SetattrArgs {
                    object: fh,
                    new_attributes: Sattr3 {
                        size: Some(size),
                        ..Sattr3::default()
                    },
                    guard: None,
                })
                .await,
        )?;
        if self.expect(&format!("SETATTR {n} size {size}"), Nfsstat3::Ok, s)
            && let Some(i) = self.m.inodes.get_mut(&ino)
        {
            i.data.resize(size as usize, 0);
        }
        Ok(())
    }

    async fn write(&mut self) -> Result<(), ClientError> {
        let Some((n, ino)) = self.pick_file() else {
            return self.create().await;
        };
        let len = self.rng.random_range(1..=64usize << 10);
        let off = self.rng.random_range(0..=self.max_file - len);
        let data = pattern(&mut self.rng, len);
        let fh = self.m.inodes[&ino].fh.clone();
        let (s, ok) = status(
            self.c
                .write(
                    &fh,
                    off as u64,
                    Bytes::from(data.clone()),
                    StableHow::FileSync,
                )
                .await,
        )?;
        if self.expect(&format!("WRITE {n} {off}+{len}"), Nfsstat3::Ok, s) {
            let count = ok.map_or(0, |o| o.count as usize);
            if count != len {
                self.report.mismatches += 1;
                self.problem(format!("WRITE {n}: {count} of {len} bytes written"));
            }
            if let Some(i) = self.m.inodes.get_mut(&ino) {
                if i.data.len() < off + len {
                    i.data.resize(off + len, 0);
                }
                i.data[off..off + len].copy_from_slice(&data);
            }
        }
        Ok(())
    }

    async fn read(&mut self) -> Result<(), ClientError> {
        let Some((n, ino)) = self.pick_file() else {
            return self.create().await;
        };
        let fh = self.m.inodes[&ino].fh.clone();
        let want = self.m.inodes[&ino].data.clone();
        let (s, ok) = status(self.c.read(&fh, 0, (want.len() + 1) as u32).await)?;
        if self.expect(&format!("READ {n}"), Nfsstat3::Ok, s) {
            let got = ok.map(|o| (o.data.0, o.eof));
            match got {
                Some((d, true)) if d[..] == want[..] => {}
                Some((d, eof)) => {
                    self.report.mismatches += 1;
                    self.problem(format!(
                        "READ {n}: {} bytes (eof {eof}), model has {}",
                        d.len(),
                        want.len()
                    ));
                }
                None => {}
            }
        }
        Ok(())
    }

    async fn getattr(&mut self) -> Result<(), ClientError> {
        let Some((n, ino)) = self.pick_file() else {
            return self.create().await;
        };
        let fh = self.m.inodes[&ino].fh.clone();
        let (s, ok) = status(self.c.getattr(&fh).await)?;
        if self.expect(&format!("GETATTR {n}"), Nfsstat3::Ok, s)
            && let Some(o) = ok
        {
            let a = o.obj_attributes;
            let want = self.m.inodes[&ino].data.len() as u64;
            if a.ftype != Ftype3::Reg || a.size != want {
                self.report.mismatches += 1;
                self.problem(format!(
                    "GETATTR {n}: {:?} size {}, model {want}",
                    a.ftype, a.size
                ));
            }
        }
        Ok(())
    }

    async fn lookup(&mut self) -> Result<(), ClientError> {
        let n = name(&mut self.rng);
        let (s, ok) = status(self.c.lookup(&self.root, n.as_bytes()).await)?;
        let want = self.m.names.get(&n).cloned();
        let want_s = if want.is_some() {
            Nfsstat3::Ok
        } else {
            Nfsstat3::NoEnt
        };
        if self.expect(&format!("LOOKUP {n}"), want_s, s)
            && let (Some(o), Some(node)) = (ok, want)
        {
            let t = o.obj_attributes.map(|a| a.ftype);
            let want_t = match node {
                Node::File(_) => Ftype3::Reg,
                Node::Dir => Ftype3::Dir,
                Node::Link(_) => Ftype3::Lnk,
            };
            if t != Some(want_t) {
                self.report.mismatches += 1;
                self.problem(format!("LOOKUP {n}: {t:?}, model {want_t:?}"));
            }
        }
        Ok(())
    }

    async fn readdir(&mut self) -> Result<(), ClientError> {
        let entries = self.c.readdirplus_all(&self.root).await?;
        let got: BTreeSet<String> = entries
            .iter()
            .map(|e| String::from_utf8_lossy(&e.name.0).into_owned())
            .filter(|n| n != "." && n != "..")
            .collect();
        let want: BTreeSet<String> = self.m.names.keys().cloned().collect();
        if got != want {
            self.report.mismatches += 1;
            self.problem(format!("READDIRPLUS: {got:?}, model {want:?}"));
        }
        Ok(())
    }

    /// Compare the final tree, over NFS and on disk, with the model.
    pub(super) async fn verify(&mut self, dir: &Path) {
        let names: Vec<(String, Node)> = self
            .m
            .names
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (n, node) in names {
            let path = dir.join(&n);
            let ok = match &node {
                Node::File(_) => {
                    let Some(i) = self.m.file(&n) else { continue };
                    let want = i.data.clone();
                    let fh = i.fh.clone();
                    let over_nfs = self.c.read_all(&fh, 1 << 20).await.ok();
                    let on_disk = std::fs::read(&path).ok();
                    self.report.files_checked += 1;
                    self.report.bytes_checked += want.len() as u64;
                    over_nfs.as_deref() == Some(&want[..]) && on_disk.as_deref() == Some(&want[..])
                }
                Node::Dir => path.is_dir(),
                Node::Link(t) => std::fs::read_link(&path)
                    .is_ok_and(|p| p.as_os_str().as_encoded_bytes() == &t[..]),
            };
            if !ok {
                self.report.final_mismatches += 1;
                self.problem(format!("final tree: {n} differs from the model"));
            }
        }
        let on_disk: BTreeSet<String> = std::fs::read_dir(dir)
            .map(|it| {
                it.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        let want: BTreeSet<String> = self.m.names.keys().cloned().collect();
        if on_disk != want {
            self.report.final_mismatches += 1;
            self.problem(format!("final tree: names {on_disk:?}, model {want:?}"));
        }
    }
}
