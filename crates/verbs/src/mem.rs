//! Protection domains and memory regions (STag table).

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use rand::Rng;

use crate::VerbsError;
use crate::provider::{NativeMr, NativePd};

/// Memory access rights (rdma-core `IBV_ACCESS_*`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u32);

impl Access {
    /// No remote access, read-only locally.
    pub const NONE: Access = Access(0);
    /// The local side may write (receive buffers, Read sinks).
    pub const LOCAL_WRITE: Access = Access(1);
    /// The peer may RDMA Write into the region.
    pub const REMOTE_WRITE: Access = Access(2);
    /// The peer may RDMA Read from the region.
    pub const REMOTE_READ: Access = Access(4);

    /// True if every bit of `other` is set in `self`.
    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// Union of two sets (usable in `const`).
    pub const fn union(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }

    /// Raw bits.
    pub fn bits(self) -> u32 {
        self.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut v = Vec::new();
        if self.contains(Access::LOCAL_WRITE) {
            v.push("LOCAL_WRITE");
        }
        if self.contains(Access::REMOTE_WRITE) {
            v.push("REMOTE_WRITE");
        }
        if self.contains(Access::REMOTE_READ) {
            v.push("REMOTE_READ");
        }
        write!(f, "Access({})", v.join("|"))
    }
}

/// Shared state of one registered region.
#[derive(Debug)]
pub(crate) struct MrInner {
    pub(crate) pd: u32,
    pub(crate) index: u32,
    pub(crate) base: u64,
    pub(crate) data: Mutex<Backing>,
    pub(crate) state: Mutex<MrState>,
}

/// The memory behind a region: its own buffer, or bytes a caller shares with it
/// ([`ProtectionDomain::register_bytes`]). Shared bytes are never written: the first write
/// through [`Backing::make_mut`] gives the region a copy of its own, so a caller's `Bytes`
/// (and every other holder of the same memory) keeps what it had.
#[derive(Debug)]
pub(crate) enum Backing {
    Owned(Box<[u8]>),
    Shared(Bytes),
}

impl Default for Backing {
    fn default() -> Self {
        Backing::Owned(Box::default())
    }
}

impl std::ops::Deref for Backing {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Backing::Owned(b) => b,
            Backing::Shared(b) => b,
        }
    }
}

impl Backing {
    /// The bytes, writable: shared bytes become a buffer of the region's own first, copied
    /// unless the region was their last holder (`Vec::from(Bytes)` then takes them as they are).
    pub(crate) fn make_mut(&mut self) -> &mut [u8] {
        if let Backing::Shared(b) = self {
            let b = std::mem::take(b);
            *self = Backing::Owned(Vec::from(b).into_boxed_slice());
        }
        match self {
            Backing::Owned(b) => b,
            Backing::Shared(_) => unreachable!("made owned above"),
        }
    }

    /// A range of the bytes as `Bytes`: a slice of shared bytes, a copy of owned ones.
    pub(crate) fn bytes(&self, r: std::ops::Range<usize>) -> Bytes {
        match self {
            Backing::Owned(b) => Bytes::copy_from_slice(&b[r]),
            Backing::Shared(b) => b.slice(r),
        }
    }

    /// The bytes as a `Vec`, without a copy when the region owns them (or is the last holder
    /// of shared bytes).
    fn into_vec(self) -> Vec<u8> {
        match self {
            Backing::Owned(b) => b.into_vec(),
            Backing::Shared(b) => Vec::from(b),
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct MrState {
    pub(crate) key: u8,
    pub(crate) valid: bool,
    pub(crate) access: Access,
}

impl MrInner {
    pub(crate) fn len(&self) -> usize {
        self.data.lock().len()
    }
    pub(crate) fn stag(&self) -> u32 {
        (self.index << 8) | u32::from(self.state.lock().key)
    }
}

/// Why an STag lookup failed; maps to Terminate codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AccessFault {
    /// No such STag, wrong key, or invalidated.
    InvalidStag,
    /// Registered in another protection domain.
    WrongPd,
    /// Access rights do not allow the operation.
    Rights,
    /// Offset/length outside the region.
    Bounds,
}

/// Fibonacci hashing of 32-bit identifiers that this side chooses (STag indices here, the XIDs
/// of its own calls in `rpcrdma`): one multiplication instead of SipHash, using both the low and
/// the high bits of the product. A peer only looks such keys up (a miss costs nothing extra), so
/// there is no collision flooding to defend against. Not for keys a peer picks, unless built
/// by [`KeyedIds`] with a secret key and kept to a set the peer cannot grow past a bound
/// (`rpcrdma`'s set of the peer's executing XIDs, bounded by the credits granted).
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

impl IdHasher {
    /// A hasher whose state starts at `seed` instead of zero.
    pub fn seeded(seed: u64) -> Self {
        IdHasher(seed)
    }
}

impl Hasher for IdHasher {
    /// The product's high half folded into its low half: hash tables pick buckets with the low
    /// bits, which alone would not see keys that differ only in their high bits.
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ u64::from(n)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// [`IdHasher`] starting from a secret key: the builder for tables whose keys a peer may
/// choose (the XIDs of its calls in `rpcrdma`, the addresses of RDS peers), where the table is
/// also kept to a bound the peer cannot grow past. Without the key a peer cannot aim its keys
/// at one bucket; with a bound, even a full collision costs a walk of that many entries. One
/// multiplication per word instead of SipHash's hundred-odd instructions per lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyedIds(u64);

impl KeyedIds {
    /// A builder with this key: from a seeded generator where runs must repeat (a simulator).
    pub fn new(key: u64) -> Self {
        KeyedIds(key)
    }
}

impl Default for KeyedIds {
    /// The process's key, drawn from the operating system once.
    fn default() -> Self {
        static KEY: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        KeyedIds(*KEY.get_or_init(|| rand::rng().random()))
    }
}

impl std::hash::BuildHasher for KeyedIds {
    type Hasher = IdHasher;
    fn build_hasher(&self) -> IdHasher {
        IdHasher::seeded(self.0)
    }
}

/// Device-wide STag table (RFC 5040 §5: STag = 24-bit index and 8-bit key). Looked up on every
/// placement and every tagged access, by every connection's thread: a read-write lock, written
/// only on registration and deregistration.
#[derive(Debug, Default)]
pub(crate) struct StagTable {
    map: RwLock<HashMap<u32, Arc<MrInner>, BuildHasherDefault<IdHasher>>>,
    next_pd: AtomicU32,
}

impl StagTable {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            map: RwLock::default(),
            next_pd: AtomicU32::new(1),
        })
    }

    /// Find a region by STag; checks key, validity, PD, access and bounds.
    pub(crate) fn check(
        &self,
        stag: u32,
        pd: u32,
        need: Access,
        to: u64,
        len: u64,
    ) -> Result<Arc<MrInner>, AccessFault> {
        let mr = self
            .map
            .read()
            .get(&(stag >> 8))
            .cloned()
            .ok_or(AccessFault::InvalidStag)?;
        let st = *mr.state.lock();
        if !st.valid || st.key != (stag & 0xff) as u8 {
            return Err(AccessFault::InvalidStag);
        }
        if mr.pd != pd {
            return Err(AccessFault::WrongPd);
        }
        if !st.access.contains(need) {
            return Err(AccessFault::Rights);
        }
        let end = to.checked_add(len).ok_or(AccessFault::Bounds)?;
        if to < mr.base || end > mr.base + mr.len() as u64 {
            return Err(AccessFault::Bounds);
        }
        Ok(mr)
    }

    /// Invalidate an STag (local or remote invalidation). It must belong to `pd`.
    pub(crate) fn invalidate(&self, stag: u32, pd: u32) -> Result<(), AccessFault> {
        let mr = self
            .map
            .read()
            .get(&(stag >> 8))
            .cloned()
            .ok_or(AccessFault::InvalidStag)?;
        let mut st = mr.state.lock();
        if st.key != (stag & 0xff) as u8 || !st.valid {
            return Err(AccessFault::InvalidStag);
        }
        if mr.pd != pd {
            return Err(AccessFault::WrongPd);
        }
        st.valid = false;
        Ok(())
    }

    fn insert(&self, pd: u32, data: Backing, access: Access) -> Arc<MrInner> {
        let mut rng = rand::rng();
        let mut map = self.map.write();
        // RFC 8166 §8.1.2 / RFC 5042: STags should not be predictable.
        let index = loop {
            let i = rng.random_range(1..(1u32 << 24));
            if !map.contains_key(&i) {
                break i;
            }
        };
        let inner = Arc::new(MrInner {
            pd,
            index,
            base: 0,
            data: Mutex::new(data),
            state: Mutex::new(MrState {
                key: rng.random(),
                valid: true,
                access,
            }),
        });
        map.insert(index, inner.clone());
        inner
    }

    /// Insert with a fixed STag index and key 0 (test and fuzz harnesses only).
    pub(crate) fn insert_fixed(
        &self,
        pd: u32,
        index: u32,
        data: Box<[u8]>,
        access: Access,
    ) -> Arc<MrInner> {
        let inner = Arc::new(MrInner {
            pd,
            index,
            base: 0,
            data: Mutex::new(Backing::Owned(data)),
            state: Mutex::new(MrState {
                key: 0,
                valid: true,
                access,
            }),
        });
        self.map.write().insert(index, inner.clone());
        inner
    }

    fn remove(&self, index: u32) {
        self.map.write().remove(&index);
    }
}

/// Protection domain: STags are only usable on QPs of the same PD.
#[derive(Clone)]
pub struct ProtectionDomain {
    pub(crate) id: u32,
    pub(crate) table: Arc<StagTable>,
    pub(crate) device: crate::Device,
    /// The native PD (or why it could not be allocated); `None` for soft providers.
    pub(crate) native: Option<Result<Arc<dyn NativePd>, VerbsError>>,
}

impl fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("id", &self.id)
            .finish()
    }
}

impl ProtectionDomain {
    pub(crate) fn new(device: crate::Device) -> Self {
        let table = device.table();
        let id = table.next_pd.fetch_add(1, Ordering::Relaxed);
        let native = device.native().map(|d| d.and_then(|d| d.alloc_pd()));
        Self {
            id,
            table,
            device,
            native,
        }
    }

    /// The device this PD belongs to.
    pub fn device(&self) -> &crate::Device {
        &self.device
    }

    /// Register `len` zeroed bytes.
    pub fn register_len(&self, len: usize, access: Access) -> Result<MemoryRegion, VerbsError> {
        self.register(vec![0u8; len], access)
    }

    /// Register a buffer (taken by value; read it back with [`MemoryRegion::read`]).
    pub fn register(
        &self,
        buf: impl Into<Vec<u8>>,
        access: Access,
    ) -> Result<MemoryRegion, VerbsError> {
        let v: Vec<u8> = buf.into();
        self.register_backing(Backing::Owned(v.into_boxed_slice()), access)
    }

    /// Register bytes shared with the caller, without copying them: the source of an RDMA
    /// Read the peer will make (an RPC-over-RDMA Read chunk), say, whose `Bytes` other
    /// holders keep. The region never writes them: a local write, or a placement allowed by
    /// rights added later ([`MemoryRegion::reregister`]), first gives the region a copy of
    /// its own. A device with native regions (rdma-core) makes them the region's own at once
    /// (a copy unless nothing else holds them), since its buffer must not move.
    pub fn register_bytes(&self, buf: Bytes, access: Access) -> Result<MemoryRegion, VerbsError> {
        self.register_backing(Backing::Shared(buf), access)
    }

    fn register_backing(&self, v: Backing, access: Access) -> Result<MemoryRegion, VerbsError> {
        if v.len() > u32::MAX as usize {
            return Err(VerbsError::InvalidArgument("region larger than 4 GiB"));
        }
        // rdma-core: remote write needs local write.
        if access.contains(Access::REMOTE_WRITE) && !access.contains(Access::LOCAL_WRITE) {
            return Err(VerbsError::InvalidArgument(
                "REMOTE_WRITE requires LOCAL_WRITE",
            ));
        }
        let inner = self.table.insert(self.id, v, access);
        let native = match &self.native {
            None => None,
            Some(Err(e)) => {
                self.table.remove(inner.index);
                return Err(e.clone());
            }
            Some(Ok(pd)) => {
                // The soft table entry is never used remotely on a hardware device: only the
                // device sees the hardware STag.
                self.table.remove(inner.index);
                let (ptr, len) = {
                    let mut d = inner.data.lock();
                    let d = d.make_mut();
                    (d.as_mut_ptr(), d.len())
                };
                // SAFETY: `make_mut` left the region owning a boxed slice (shared bytes were
                // copied into one), which later `make_mut` calls do not move: it stays in place
                // until the region is dropped or `take` moves it out, and both deregister first.
                Some(unsafe { pd.clone().register(ptr, len, access)? })
            }
        };
        Ok(MemoryRegion {
            inner,
            table: self.table.clone(),
            native,
        })
    }
}

/// A registered memory region. Dropping it deregisters it (its STag stops working).
pub struct MemoryRegion {
    inner: Arc<MrInner>,
    table: Arc<StagTable>,
    /// The native registration of the same buffer.
    native: Option<Box<dyn NativeMr>>,
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("stag", &format_args!("{:#010x}", self.rkey()))
            .field("len", &self.len())
            .finish()
    }
}

impl MemoryRegion {
    /// Local key (same as the STag on iWARP).
    pub fn lkey(&self) -> u32 {
        if let Some(h) = &self.native {
            return h.lkey();
        }
        self.inner.stag()
    }

    /// Remote key: the STag advertised to the peer.
    pub fn rkey(&self) -> u32 {
        if let Some(h) = &self.native {
            return h.rkey();
        }
        self.inner.stag()
    }

    /// Base address (tagged offset of byte 0). Soft providers use zero-based TOs; rdma-core
    /// uses the buffer's virtual address.
    pub fn addr(&self) -> u64 {
        if let Some(h) = &self.native {
            return h.addr();
        }
        self.inner.base
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// True if zero-length.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Access rights.
    pub fn access(&self) -> Access {
        self.inner.state.lock().access
    }

    /// True until invalidated.
    pub fn is_valid(&self) -> bool {
        self.inner.state.lock().valid
    }

    /// Copy bytes out of the region.
    pub fn read(&self, off: usize, len: usize) -> Result<Bytes, VerbsError> {
        let d = self.inner.data.lock();
        let end = off
            .checked_add(len)
            .filter(|e| *e <= d.len())
            .ok_or(VerbsError::OutOfBounds)?;
        Ok(Bytes::copy_from_slice(&d[off..end]))
    }

    /// Invalidate the STag and take the region's first `len` bytes out without copying (the
    /// region is left empty). For a sink whose contents the consumer wants once: copying a
    /// 1 MiB region into fresh memory cost 0.5-1.4 ms here, mostly page faults.
    pub fn take(&self, len: usize) -> Result<Bytes, VerbsError> {
        if len > self.inner.len() {
            return Err(VerbsError::OutOfBounds);
        }
        let mut v = self.take_vec()?;
        v.truncate(len);
        Ok(Bytes::from(v))
    }

    /// Invalidate the STag and take the whole buffer out without copying, for a consumer that
    /// builds its result around the bytes the peer wrote (the region is left empty, so a
    /// second call returns an empty buffer).
    pub fn take_vec(&self) -> Result<Vec<u8>, VerbsError> {
        self.inner.state.lock().valid = false;
        if let Some(h) = &self.native {
            // The device must be done with the buffer before it moves.
            h.deregister();
        }
        let mut d = self.inner.data.lock();
        Ok(std::mem::take(&mut *d).into_vec())
    }

    /// Copy bytes into the region.
    pub fn write(&self, off: usize, src: &[u8]) -> Result<(), VerbsError> {
        let mut d = self.inner.data.lock();
        let end = off
            .checked_add(src.len())
            .filter(|e| *e <= d.len())
            .ok_or(VerbsError::OutOfBounds)?;
        d.make_mut()[off..end].copy_from_slice(src);
        Ok(())
    }

    /// Run `f` over the whole region's bytes under its lock.
    pub fn with_bytes<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        f(self.inner.data.lock().make_mut())
    }

    /// Invalidate the STag locally (the local equivalent of a Local Invalidate WR).
    pub fn invalidate(&self) {
        self.inner.state.lock().valid = false;
        if let Some(h) = &self.native {
            h.deregister();
        }
    }

    /// Re-register: rotate the 8-bit key (RFC 5040 §5: the consumer owns the key), optionally
    /// change the access rights, and make the region valid again. The old STag stops working.
    ///
    /// On rdma-core the buffer is registered again (the device picks the new STag); if that
    /// fails the region stays invalid and the returned rkey is the stale one.
    pub fn reregister(&self, access: Option<Access>) -> u32 {
        let access = {
            let mut st = self.inner.state.lock();
            st.key = st.key.wrapping_add(1);
            st.valid = true;
            if let Some(a) = access {
                st.access = a;
            }
            st.access
        };
        if let Some(Err(e)) = self.native.as_ref().map(|h| h.reregister(access)) {
            tracing::warn!("re-registration failed: {e}");
            self.inner.state.lock().valid = false;
        }
        self.rkey()
    }

    /// Sge covering `[off, off+len)` of this region.
    pub fn sge(&self, off: u64, len: u32) -> crate::Sge {
        crate::Sge {
            lkey: self.lkey(),
            addr: self.addr() + off,
            length: len,
        }
    }

    /// Deregister now (same as dropping).
    pub fn deregister(self) {}
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        self.inner.state.lock().valid = false;
        if let Some(h) = &self.native {
            h.deregister();
        }
        self.table.remove(self.inner.index);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Device, Provider};

    #[test]
    fn keyed_ids_hash_by_their_key() {
        use std::hash::BuildHasher;
        // The process's key is one key: tables built by default hash alike.
        assert_eq!(
            KeyedIds::default().hash_one(0x0a00_0002u32),
            KeyedIds::default().hash_one(0x0a00_0002u32)
        );
        // A given key repeats (a seeded simulator iterates its tables alike on every run),
        // and another key moves the same ids to other buckets.
        let (a, b) = (KeyedIds::new(1), KeyedIds::new(2));
        assert_eq!(a.hash_one(7u64), KeyedIds::new(1).hash_one(7u64));
        let addrs: Vec<std::net::Ipv4Addr> =
            (1..=64u32).map(|i| (0x0a00_0000 | i).into()).collect();
        let moved = addrs
            .iter()
            .filter(|x| a.hash_one(x) % 64 != b.hash_one(x) % 64)
            .count();
        assert!(
            moved > 32,
            "{moved} of 64 addresses changed bucket with the key"
        );
        // Consecutive addresses (the peers of one subnet) spread over a table's buckets.
        let mut buckets = [false; 64];
        for x in &addrs {
            buckets[(a.hash_one(x) % 64) as usize] = true;
        }
        let filled = buckets.iter().filter(|&&f| f).count();
        assert!(
            filled >= 24,
            "64 consecutive addresses filled {filled} of 64 buckets"
        );
    }

    #[test]
    fn shared_bytes_are_registered_in_place_and_copied_on_write() {
        let pd = Device::open(Provider::SoftIwarp(Default::default())).alloc_pd();
        let data = Bytes::from(vec![5u8; 4096]);
        let mr = pd
            .register_bytes(data.clone(), Access::REMOTE_READ)
            .unwrap();
        // The region reads the caller's memory: no copy at registration.
        assert_eq!(mr.inner.data.lock().as_ptr(), data.as_ptr());
        assert!(matches!(&*mr.inner.data.lock(), Backing::Shared(_)));
        assert_eq!(
            mr.inner.data.lock().bytes(10..20).as_ptr(),
            data[10..].as_ptr()
        );
        // The first write gives the region its own copy; the caller's bytes stay as they were.
        mr.write(0, b"new").unwrap();
        assert_ne!(mr.inner.data.lock().as_ptr(), data.as_ptr());
        assert_eq!(&mr.read(0, 4).unwrap()[..], b"new\x05");
        assert!(data.iter().all(|b| *b == 5));
        // Bytes nothing else holds become the region's own without a copy.
        let alone = Bytes::from(vec![6u8; 4096]);
        let at = alone.as_ptr();
        let mr3 = pd.register_bytes(alone, Access::REMOTE_READ).unwrap();
        mr3.write(0, b"x").unwrap();
        assert_eq!(mr3.inner.data.lock().as_ptr(), at);
        // Taking the bytes out works on either backing.
        let mr2 = pd
            .register_bytes(data.clone(), Access::REMOTE_READ)
            .unwrap();
        assert_eq!(mr2.take_vec().unwrap(), vec![5u8; 4096]);
        assert_eq!(mr.take(3).unwrap(), Bytes::from_static(b"new"));
    }

    #[test]
    fn take_fences_the_region_and_moves_its_bytes_out() {
        let pd = Device::open(Provider::SoftIwarp(Default::default())).alloc_pd();
        let mr = pd
            .register_len(8, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        mr.write(0, b"abcdefgh").unwrap();
        assert!(mr.is_valid());
        assert_eq!(&mr.take(5).unwrap()[..], b"abcde");
        // Fenced: the STag no longer works, and the memory is gone rather than shared.
        assert!(!mr.is_valid());
        assert!(matches!(mr.take(1), Err(VerbsError::OutOfBounds)));
        assert!(matches!(mr.read(0, 1), Err(VerbsError::OutOfBounds)));
        // Asking for more than the region holds is refused without taking anything.
        let mr2 = pd.register(vec![1u8; 4], Access::LOCAL_WRITE).unwrap();
        assert!(matches!(mr2.take(5), Err(VerbsError::OutOfBounds)));
        assert_eq!(&mr2.read(0, 4).unwrap()[..], &[1, 1, 1, 1]);
    }
}
