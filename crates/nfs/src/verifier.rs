//! The write verifier across restarts.
//!
//! RFC 1813 §3.3.7 (and RFC 8881 §18.32.3 for NFSv4): a client keeps the data of its UNSTABLE
//! WRITEs until a COMMIT returns the verifier its WRITEs returned; a different verifier means
//! the server may have lost them, and the client sends them again. A server therefore changes
//! its verifier whenever it may have lost uncommitted data: after a crash, and by default
//! after every restart.
//!
//! A clean shutdown loses nothing if every export is synced to stable storage first. With a
//! state file, the server records that fact ("clean" and the verifier) after the sync; the
//! next start takes that verifier again and at once overwrites the record with "running", so
//! a crash afterwards (no clean record) makes the start after it choose a new verifier. A
//! record that cannot be read, or any other content, means a new verifier too.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// A write verifier (`writeverf3`, `verifier4`).
pub type Verifier = [u8; 8];

/// A verifier no earlier instance is likely to have used: random, mixed with the time.
pub fn fresh() -> Verifier {
    let mut v = rand::random::<Verifier>();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    for (b, t) in v.iter_mut().zip(now.to_be_bytes()) {
        *b ^= t;
    }
    v
}

/// How a start found its verifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The previous instance shut down cleanly: its verifier is kept.
    Kept,
    /// No clean record (first start, a crash, an unreadable file): a new one.
    New,
}

/// The state file holding the verifier between instances.
#[derive(Debug, Clone)]
pub struct VerifierFile {
    path: PathBuf,
}

const CLEAN: &str = "clean";
const RUNNING: &str = "running";

fn hex(v: &Verifier) -> String {
    v.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_record(text: &str) -> Option<Verifier> {
    let mut words = text.split_whitespace();
    if words.next()? != CLEAN {
        return None;
    }
    let h = words.next()?;
    if h.len() != 16 || words.next().is_some() {
        return None;
    }
    let mut v = [0u8; 8];
    for (i, b) in v.iter_mut().enumerate() {
        *b = u8::from_str_radix(h.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(v)
}

impl VerifierFile {
    /// The record at `path` (created on the first start).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        VerifierFile { path: path.into() }
    }

    /// Where the record is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The verifier of this start: the previous one after a clean shutdown, a new one
    /// otherwise. Either way the file says "running" afterwards, durably, before any client
    /// can see the verifier.
    pub fn start(&self) -> io::Result<(Verifier, Origin)> {
        let previous = std::fs::read_to_string(&self.path)
            .ok()
            .as_deref()
            .and_then(parse_record);
        let (v, origin) = match previous {
            Some(v) => (v, Origin::Kept),
            None => (fresh(), Origin::New),
        };
        self.write(&format!("{RUNNING} {}\n", hex(&v)))?;
        Ok((v, origin))
    }

    /// Record a clean shutdown with `v`: call only once every export is synced and no call
    /// runs any more.
    pub fn clean_shutdown(&self, v: &Verifier) -> io::Result<()> {
        self.write(&format!("{CLEAN} {}\n", hex(v)))
    }

    /// Replace the file's content durably: a temporary file beside it, synced, renamed over
    /// it, and the directory synced.
    fn write(&self, text: &str) -> io::Result<()> {
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &self.path)?;
        std::fs::File::open(&dir)?.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clean_shutdown_keeps_the_verifier_and_a_crash_does_not() {
        let tmp = tempfile::tempdir().unwrap();
        let f = VerifierFile::new(tmp.path().join("verf"));
        let (v1, o1) = f.start().unwrap();
        assert_eq!(o1, Origin::New);
        // Crash: no clean record, so a new verifier.
        let (v2, o2) = f.start().unwrap();
        assert_eq!(o2, Origin::New);
        assert_ne!(v1, v2);
        // Clean shutdown: the next start keeps it, once.
        f.clean_shutdown(&v2).unwrap();
        let (v3, o3) = f.start().unwrap();
        assert_eq!((v3, o3), (v2, Origin::Kept));
        let (v4, o4) = f.start().unwrap();
        assert_eq!(o4, Origin::New);
        assert_ne!(v4, v3);
    }

    #[test]
    fn only_a_well_formed_clean_record_is_trusted() {
        assert_eq!(
            parse_record("clean 0102030405060708\n"),
            Some([1, 2, 3, 4, 5, 6, 7, 8])
        );
        for bad in [
            "",
            "running 0102030405060708",
            "clean 01020304050607",
            "clean 01020304050607zz",
            "clean 0102030405060708 extra",
            "clean é102030405060708",
        ] {
            assert_eq!(parse_record(bad), None, "{bad:?}");
        }
    }
}
