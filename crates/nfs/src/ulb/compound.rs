//! NFS version 4 (RFC 8267 §6): the COMPOUND scanner that finds the DDP-eligible items of a
//! call and of its reply, and Write-chunk pairing.

use std::ops::Range;

use rpcrdma::ulb::UlbError;
use xdr::{Decoder, XdrError};

use super::opaque_item;

/// NFSv4 operation numbers with DDP-eligible items, and a few the scanner needs by name.
pub mod op4 {
    pub const ACCESS: u32 = 3;
    pub const CREATE: u32 = 6;
    pub const GETATTR: u32 = 9;
    pub const GETFH: u32 = 10;
    pub const LOOKUP: u32 = 15;
    pub const PUTFH: u32 = 22;
    pub const PUTPUBFH: u32 = 23;
    pub const PUTROOTFH: u32 = 24;
    pub const READ: u32 = 25;
    pub const READLINK: u32 = 27;
    pub const RESTOREFH: u32 = 31;
    pub const SAVEFH: u32 = 32;
    pub const WRITE: u32 = 38;
    pub const CREATE_SESSION: u32 = 43;
    pub const SEQUENCE: u32 = 53;
    pub const ILLEGAL: u32 = 10044;
    /// NF4LNK in `nfs_ftype4`.
    pub const NF4LNK: u32 = 5;
}

const NFS4_FHSIZE: u32 = 128;

const NFS4_OPAQUE_LIMIT: u32 = 1024;

/// Decoder bound for unbounded NFSv4 opaques and strings while scanning.
const MAX4: u32 = 1 << 26;

/// Decoder bound for NFSv4 arrays while scanning.
const MAX_ARRAY4: u32 = 1 << 16;

/// One NFSv4 COMPOUND as the scanner saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompoundScan {
    pub minorversion: u32,
    /// Operation numbers in order (an unknown operation ends the list, as it ends execution).
    pub ops: Vec<u32>,
    /// Byte ranges of the DDP-eligible argument items (WRITE data, CREATE NF4LNK linkdata).
    pub ddp_items: Vec<Range<usize>>,
    /// Indices into `ops` of the "READ operations" of RFC 8267 §6.4.1 (READ, READLINK).
    pub read_like: Vec<usize>,
    /// The session of a leading SEQUENCE (NFSv4.1+).
    pub sessionid: Option<[u8; 16]>,
    /// The fore-channel ca_maxresponsesize of a CREATE_SESSION in this COMPOUND.
    pub create_session_max_response: Option<u32>,
    /// True when an operation number was not recognised (the scan stopped there).
    pub stopped_at_unknown: bool,
}

struct W<'a, 'b>(&'b mut Decoder<'a>);

impl W<'_, '_> {
    fn u32(&mut self) -> xdr::Result<u32> {
        self.0.u32()
    }
    fn n(&mut self, words: usize) -> xdr::Result<()> {
        self.0.skip(words * 4)
    }
    fn opaque(&mut self, max: u32) -> xdr::Result<()> {
        self.0.opaque(max).map(drop)
    }
    fn bool(&mut self) -> xdr::Result<bool> {
        self.0.bool()
    }
    fn stateid(&mut self) -> xdr::Result<()> {
        self.n(4)
    }
    fn bitmap(&mut self) -> xdr::Result<()> {
        let n = self.0.length(MAX_ARRAY4)? as usize;
        self.n(n)
    }
    fn fattr(&mut self) -> xdr::Result<()> {
        self.bitmap()?;
        self.opaque(MAX4)
    }
    fn owner(&mut self) -> xdr::Result<()> {
        self.n(2)?;
        self.opaque(NFS4_OPAQUE_LIMIT)
    }
    fn netaddr(&mut self) -> xdr::Result<()> {
        self.opaque(MAX4)?;
        self.opaque(MAX4)
    }
    fn array(&mut self, mut item: impl FnMut(&mut Self) -> xdr::Result<()>) -> xdr::Result<()> {
        let n = self.0.length(MAX_ARRAY4)?;
        for _ in 0..n {
            item(self)?;
        }
        Ok(())
    }
    fn sec_parms(&mut self) -> xdr::Result<()> {
        self.array(|w| match w.u32()? {
            0 => Ok(()),
            1 => {
                // authsys_parms
                w.n(1)?;
                w.opaque(255)?;
                w.n(2)?;
                let n = w.0.length(16)? as usize;
                w.n(n)
            }
            6 => {
                w.n(1)?;
                w.opaque(MAX4)?;
                w.opaque(MAX4)
            }
            v => Err(bad("callback_sec_parms4", v)),
        })
    }
    fn channel_attrs(&mut self) -> xdr::Result<u32> {
        self.n(2)?;
        let maxresp = self.u32()?;
        self.n(3)?;
        let n = self.0.length(1)? as usize;
        self.n(n)?;
        Ok(maxresp)
    }
    fn netloc(&mut self) -> xdr::Result<()> {
        match self.u32()? {
            1 | 2 => self.opaque(MAX4),
            3 => self.netaddr(),
            v => Err(bad("netloc_type4", v)),
        }
    }
    fn layoutupdate(&mut self) -> xdr::Result<()> {
        self.n(1)?;
        self.opaque(MAX4)
    }
}

fn bad(type_name: &'static str, v: u32) -> XdrError {
    XdrError::InvalidDiscriminant {
        type_name,
        value: i64::from(v),
    }
}

/// What skipping one operation's arguments found.
enum OpFound {
    Nothing,
    Item(Range<usize>),
    Session([u8; 16]),
    CreateSession(u32),
}

/// Skip the arguments of operation `op` (RFC 7530 §16, RFC 5661 §18, RFC 7862 §15,
/// RFC 8276 §8.4). `Ok(None)` for an operation number this scanner does not know.
fn skip_op_args(op: u32, d: &mut Decoder<'_>) -> xdr::Result<Option<OpFound>> {
    let mut w = W(d);
    let mut found = OpFound::Nothing;
    match op {
        // void arguments
        10 | 16 | 23 | 24 | 27 | 31 | 32 | op4::ILLEGAL => {}
        3 | 52 => w.n(1)?, // ACCESS, SECINFO_NO_NAME
        4 => {
            // CLOSE
            w.n(1)?;
            w.stateid()?;
        }
        5 => w.n(3)?, // COMMIT
        op4::CREATE => {
            match w.u32()? {
                op4::NF4LNK => {
                    // RFC 8267 §6.1: NF4LNK linkdata is DDP-eligible.
                    found = OpFound::Item(opaque_item(w.0, MAX4)?);
                }
                3 | 4 => w.n(2)?,
                _ => {}
            }
            w.opaque(MAX4)?;
            w.fattr()?;
        }
        7 | 30 | 57 => w.n(2)?, // DELEGPURGE, RENEW, DESTROY_CLIENTID
        8 | 45 | 66 | 67 => w.stateid()?, // DELEGRETURN, FREE_STATEID, OFFLOAD_*
        9 => w.bitmap()?,       // GETATTR
        11 | 15 | 28 | 33 | 72 | 75 => w.opaque(MAX4)?, // component4 arguments
        12 => {
            // LOCK
            w.n(1)?;
            w.bool()?;
            w.n(4)?;
            if w.bool()? {
                w.n(1)?;
                w.stateid()?;
                w.n(1)?;
                w.owner()?;
            } else {
                w.stateid()?;
                w.n(1)?;
            }
        }
        13 => {
            // LOCKT
            w.n(5)?;
            w.owner()?;
        }
        14 => {
            // LOCKU
            w.n(2)?;
            w.stateid()?;
            w.n(4)?;
        }
        17 | 37 => w.fattr()?, // NVERIFY, VERIFY
        18 => {
            // OPEN
            w.n(3)?;
            w.owner()?;
            if w.u32()? == 1 {
                match w.u32()? {
                    0 | 1 => w.fattr()?,
                    2 => w.n(2)?,
                    3 => {
                        w.n(2)?;
                        w.fattr()?;
                    }
                    v => return Err(bad("createmode4", v)),
                }
            }
            match w.u32()? {
                0 | 3 => w.opaque(MAX4)?,
                1 => w.n(1)?,
                2 => {
                    w.stateid()?;
                    w.opaque(MAX4)?;
                }
                4 | 6 => {}
                5 => w.stateid()?,
                v => return Err(bad("open_claim_type4", v)),
            }
        }
        19 | 58 => {
            w.bool()?;
        }
        20 => {
            w.stateid()?;
            w.n(1)?;
        }
        21 => {
            w.stateid()?;
            w.n(3)?;
        }
        op4::PUTFH => w.opaque(NFS4_FHSIZE)?,
        op4::READ | 68 => {
            // READ, READ_PLUS
            w.stateid()?;
            w.n(3)?;
        }
        26 => {
            // READDIR
            w.n(6)?;
            w.bitmap()?;
        }
        29 => {
            w.opaque(MAX4)?;
            w.opaque(MAX4)?;
        }
        34 => {
            w.stateid()?;
            w.fattr()?;
        }
        35 => {
            // SETCLIENTID
            w.n(2)?;
            w.opaque(NFS4_OPAQUE_LIMIT)?;
            w.n(1)?;
            w.netaddr()?;
            w.n(1)?;
        }
        36 => w.n(4)?,
        op4::WRITE => {
            w.stateid()?;
            w.n(3)?;
            // RFC 8267 §6.1: WRITE4args data is DDP-eligible.
            found = OpFound::Item(opaque_item(w.0, MAX4)?);
        }
        39 => w.owner()?,
        40 => {
            w.n(1)?;
            w.sec_parms()?;
        }
        41 => {
            w.n(5)?;
            w.bool()?;
        }
        42 => {
            // EXCHANGE_ID
            w.n(2)?;
            w.opaque(NFS4_OPAQUE_LIMIT)?;
            w.n(1)?;
            match w.u32()? {
                0 => {}
                1 => {
                    w.bitmap()?;
                    w.bitmap()?;
                }
                2 => {
                    w.bitmap()?;
                    w.bitmap()?;
                    w.array(|w| w.opaque(MAX4))?;
                    w.array(|w| w.opaque(MAX4))?;
                    w.n(2)?;
                }
                v => return Err(bad("state_protect_how4", v)),
            }
            let n = w.0.length(1)?;
            for _ in 0..n {
                w.opaque(MAX4)?;
                w.opaque(MAX4)?;
                w.n(3)?;
            }
        }
        op4::CREATE_SESSION => {
            w.n(4)?;
            let fore = w.channel_attrs()?;
            w.channel_attrs()?;
            w.n(1)?;
            w.sec_parms()?;
            found = OpFound::CreateSession(fore);
        }
        44 => w.n(4)?,
        46 => {
            w.bool()?;
            w.bitmap()?;
            w.n(6)?;
            w.bitmap()?;
            w.bitmap()?;
        }
        47 => {
            w.n(6)?;
            w.bitmap()?;
        }
        48 => w.n(6)?,
        49 => {
            // LAYOUTCOMMIT
            w.n(4)?;
            w.bool()?;
            w.stateid()?;
            if w.bool()? {
                w.n(2)?;
            }
            if w.bool()? {
                w.n(3)?;
            }
            w.layoutupdate()?;
        }
        50 => {
            w.bool()?;
            w.n(8)?;
            w.stateid()?;
            w.n(1)?;
        }
        51 => {
            w.bool()?;
            w.n(2)?;
            match w.u32()? {
                1 => {
                    w.n(4)?;
                    w.stateid()?;
                    w.opaque(MAX4)?;
                }
                2 | 3 => {}
                v => return Err(bad("layoutreturn_type4", v)),
            }
        }
        op4::SEQUENCE => {
            let sid = w.0.opaque_fixed(16)?;
            let mut s = [0u8; 16];
            s.copy_from_slice(sid);
            w.n(3)?;
            w.bool()?;
            found = OpFound::Session(s);
        }
        54 => {
            w.opaque(MAX4)?;
            w.opaque(MAX4)?;
        }
        55 => w.array(|w| w.stateid())?,
        56 => {
            w.n(1)?;
            match w.u32()? {
                4 | 6 => {}
                1 => w.n(1)?,
                v => return Err(bad("deleg_claim4", v)),
            }
        }
        59 | 62 => {
            w.stateid()?;
            w.n(4)?;
        }
        60 => {
            // COPY
            w.stateid()?;
            w.stateid()?;
            w.n(6)?;
            w.bool()?;
            w.bool()?;
            w.array(|w| w.netloc())?;
        }
        61 => {
            w.stateid()?;
            w.netloc()?;
        }
        63 => {
            w.stateid()?;
            w.n(4)?;
            w.bitmap()?;
        }
        64 => {
            w.n(4)?;
            w.stateid()?;
            w.array(|w| w.n(6))?;
        }
        65 => {
            // LAYOUTSTATS
            w.n(4)?;
            w.stateid()?;
            w.n(8)?;
            w.n(4)?;
            w.layoutupdate()?;
        }
        69 => {
            w.stateid()?;
            w.n(3)?;
        }
        70 => {
            // WRITE_SAME
            w.stateid()?;
            w.n(1)?;
            w.n(2 + 2 + 2 + 2 + 1 + 2)?;
            w.opaque(MAX4)?;
        }
        71 => {
            w.stateid()?;
            w.stateid()?;
            w.n(6)?;
        }
        73 => {
            w.n(1)?;
            w.opaque(MAX4)?;
            w.opaque(MAX4)?;
        }
        74 => w.n(3)?,
        _ => return Ok(None),
    }
    Ok(Some(found))
}

/// Walk an NFSv4 COMPOUND's arguments (`COMPOUND4args`), skipping every operation, and report
/// its operations and DDP-eligible items (RFC 8267 §6.1).
pub fn scan_compound(args: &[u8]) -> xdr::Result<CompoundScan> {
    let mut dec = Decoder::new(args);
    let mut scan = CompoundScan::default();
    dec.opaque(MAX4)?; // tag
    scan.minorversion = dec.u32()?;
    let n = dec.length(MAX_ARRAY4)?;
    for i in 0..n {
        let op = dec.u32()?;
        match skip_op_args(op, &mut dec)? {
            None => {
                scan.stopped_at_unknown = true;
                return Ok(scan);
            }
            Some(found) => {
                scan.ops.push(op);
                if op == op4::READ || op == op4::READLINK {
                    scan.read_like.push(scan.ops.len() - 1);
                }
                match found {
                    OpFound::Item(r) => scan.ddp_items.push(r),
                    OpFound::Session(s) if i == 0 => scan.sessionid = Some(s),
                    OpFound::CreateSession(m) => scan.create_session_max_response = Some(m),
                    _ => {}
                }
            }
        }
    }
    dec.finish()?;
    Ok(scan)
}

/// The fore-channel `ca_maxresponsesize` of a COMPOUND containing CREATE_SESSION
/// (RFC 8267 §6.2.2), if any.
pub fn create_session_fore_attrs(args: &[u8]) -> Option<u32> {
    scan_compound(args).ok()?.create_session_max_response
}

/// How one READ operation of a COMPOUND returns its data (RFC 8267 §6.4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkUse {
    /// Return the DDP-eligible item through Write chunk `chunk`.
    Fill { chunk: usize },
    /// Return the results inline: no matching chunk, or the client provided an empty one.
    Inline,
    /// The result arm has no DDP-eligible item but the client provided a non-empty chunk:
    /// return Write chunk `chunk` empty.
    ReturnEmpty { chunk: usize },
}

//= specs/rfc8267.txt#section-6.4.1
//# o  The first chunk in the Write list MUST be used by the first READ
//# operation in an NFS version 4 COMPOUND procedure.
//= specs/rfc8267.txt#section-6.4.1
//# o  If an NFS version 4 client has provided a matching non-empty Write
//# chunk, then the corresponding READ operation MUST return its
//# DDP-eligible data item using that chunk.
//= specs/rfc8267.txt#section-6.4.1
//# o  If an NFS version 4 client has provided an empty matching Write
//# chunk, then the corresponding READ operation MUST return all of
//# its result data items inline.
//= specs/rfc8267.txt#section-6.4.1
//# o  If a READ operation returns a union arm that does not contain a
//# DDP-eligible result, and the NFS version 4 client has provided a
//# matching non-empty Write chunk, an NFS version 4 server MUST
//# return an empty Write chunk in that Write list position.
//= specs/rfc8267.txt#section-6.4.1
//# o  If there are more READ operations than Write chunks, then
//# remaining NFS READ operations in an NFS version 4 COMPOUND that
//# have no matching Write chunk MUST return their results inline.
/// RFC 8267 §6.4.1 pairing: `results_have_item[i]` says whether the i-th READ operation's
/// result carries a DDP-eligible item (READ4resok / READLINK4resok), `chunk_lens[j]` is the
/// size of the client's j-th Write chunk (0 = an empty chunk). The first chunk goes with the
/// first READ operation, and so on; READ operations beyond the Write list return inline.
pub fn pair_write_chunks(results_have_item: &[bool], chunk_lens: &[usize]) -> Vec<ChunkUse> {
    results_have_item
        .iter()
        .enumerate()
        .map(|(i, &has)| match chunk_lens.get(i) {
            None | Some(0) => ChunkUse::Inline,
            Some(_) if has => ChunkUse::Fill { chunk: i },
            Some(_) => ChunkUse::ReturnEmpty { chunk: i },
        })
        .collect()
}

/// Skip one operation's result in `COMPOUND4res` and return the offset of the DDP-eligible
/// item's contents for READ/READLINK. Covers the operations that typically accompany READ and
/// READLINK; `Ok(None)` for a result this walker does not know. A failed operation is the
/// last one (RFC 7530 §15.2), so its result body is not needed.
fn skip_op_result(op: u32, d: &mut Decoder<'_>) -> xdr::Result<Option<Option<usize>>> {
    let status = d.u32()?;
    let mut w = W(d);
    if status != 0 {
        return Ok(Some(None));
    }
    let mut item = None;
    match op {
        op4::PUTFH
        | op4::PUTPUBFH
        | op4::PUTROOTFH
        | op4::LOOKUP
        | 16
        | op4::RESTOREFH
        | op4::SAVEFH
        | 28
        | 39
        | 45
        | 30
        | 36 => {
            if op == 28 {
                w.n(5)?; // change_info4
            }
        }
        op4::ACCESS => w.n(2)?,
        op4::GETATTR => w.fattr()?,
        op4::GETFH => w.opaque(NFS4_FHSIZE)?,
        op4::READ => {
            w.bool()?;
            w.0.u32()?;
            item = Some(w.0.position());
        }
        op4::READLINK => {
            w.0.u32()?;
            item = Some(w.0.position());
        }
        op4::SEQUENCE => w.n(4 + 5)?,
        _ => return Ok(None),
    }
    Ok(Some(item))
}

/// Requester side: for each READ operation (READ, READLINK) of a reduced `COMPOUND4res`, in
/// order, the offset where its DDP-eligible item's contents belong, or `None` when its result
/// has no such item (an error status).
pub fn compound_reply_item_offsets(results: &[u8]) -> Result<Vec<Option<usize>>, UlbError> {
    let mut dec = Decoder::new(results);
    let garbage = |e: XdrError| UlbError::Garbage(e.to_string());
    dec.u32().map_err(garbage)?;
    dec.opaque(MAX4).map_err(garbage)?;
    let n = dec.length(MAX_ARRAY4).map_err(garbage)?;
    let mut out = Vec::new();
    for _ in 0..n {
        let op = dec.u32().map_err(garbage)?;
        match skip_op_result(op, &mut dec).map_err(garbage)? {
            Some(item) if op == op4::READ || op == op4::READLINK => out.push(item),
            Some(_) => {}
            // Results after an operation this walker cannot skip: only already located
            // items are known. The COMPOUND stops at the first failure anyway.
            None => break,
        }
    }
    Ok(out)
}
