//! The model of the file tree that every operation's outcome is checked against.

use std::collections::{BTreeMap, HashMap};

use nfs::nfs3::Fh3;
use rand::Rng;
use rand::rngs::StdRng;

/// A file's contents and handle.
pub(super) struct Inode {
    pub(super) data: Vec<u8>,
    pub(super) fh: Fh3,
}

#[derive(Clone)]
pub(super) enum Node {
    File(u64),
    Dir,
    Link(Vec<u8>),
}

#[derive(Default)]
pub(super) struct Model {
    pub(super) names: BTreeMap<String, Node>,
    pub(super) inodes: HashMap<u64, Inode>,
    pub(super) next_ino: u64,
}

impl Model {
    pub(super) fn files(&self) -> Vec<String> {
        self.names
            .iter()
            .filter(|(_, n)| matches!(n, Node::File(_)))
            .map(|(k, _)| k.clone())
            .collect()
    }
    pub(super) fn file(&self, name: &str) -> Option<&Inode> {
        match self.names.get(name) {
            Some(Node::File(i)) => self.inodes.get(i),
            _ => None,
        }
    }
    pub(super) fn unlink(&mut self, name: &str) {
        if let Some(Node::File(i)) = self.names.remove(name)
            && !self
                .names
                .values()
                .any(|n| matches!(n, Node::File(j) if *j == i))
        {
            self.inodes.remove(&i);
        }
    }
}

pub(super) const NAMES: usize = 24;

pub(super) fn name(rng: &mut StdRng) -> String {
    format!("n{:02}", rng.random_range(0..NAMES))
}

pub(super) fn pattern(rng: &mut StdRng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    v
}
