//! A pushed packfile (gitformat-pack(5)), read as it arrives or whole
//! from memory, and bounded: the ids of the commits and trees, kept for
//! the push's checks. What git sends (`ofs-delta`, `no-thin`) is read as
//! its bytes arrive, each delta's type known from its base's offset, so
//! the reading ends with the upload rather than starting after it; a pack
//! with a REF_DELTA is read again whole, every object hashed and every
//! delta resolved by id.
//!
//! Our own reader rather than gitoxide's `gix-pack`: that crate brings
//! `gix-features`, `gix-hash`, `gix-object`, `gix-chunk`, `gix-diff` and
//! their parallelism and memory-mapping layers (dozens of crates and
//! minutes of build on two cores) to do what this file does in a few
//! hundred lines over `flate2` and `ring`, both already in the tree. And
//! every bound here is ours to state: an object count that lies, a
//! declared size that is exceeded (a zip bomb stops at its declared size),
//! a total inflated budget, delta chains that are too deep or point at
//! themselves, a trailer whose checksum does not match.

use std::collections::HashMap;
use std::fmt;
use std::io::BufRead;
use std::ops::Range;
use std::sync::Arc;

use flate2::{Decompress, FlushDecompress, Status};
use sha1::{Digest, Sha1};

/// An object id (SHA-1).
pub type Oid = [u8; 20];

/// The zero id: a ref that does not exist.
pub const ZERO: Oid = [0; 20];

/// An object's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Commit,
    Tree,
    Blob,
    Tag,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Commit => "commit",
            Kind::Tree => "tree",
            Kind::Blob => "blob",
            Kind::Tag => "tag",
        }
    }
}

/// How much reading a pack may cost.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The largest object, inflated or rebuilt from a delta.
    pub max_object: u64,
    /// Every byte inflated or rebuilt, all objects together.
    pub max_inflated: u64,
    /// The longest delta chain.
    pub max_depth: usize,
}

impl Limits {
    /// The bounds for a pack of `len` bytes: objects up to 256 MiB, 32
    /// times the pack (at least 64 MiB, at most 4 GiB) inflated in all, and
    /// chains of 64 (git's default `--depth` is 50).
    pub fn for_pack(len: usize) -> Limits {
        Limits {
            max_object: 256 << 20,
            max_inflated: (len as u64).saturating_mul(32).clamp(64 << 20, 4 << 30),
            max_depth: 64,
        }
    }
}

/// Why a pack cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PackError {
    Header,
    Truncated,
    TrailingBytes,
    Checksum,
    BadObject(usize, &'static str),
    TooLarge(usize),
    Budget,
    DeltaTooDeep(usize),
    Zlib(usize),
}

impl fmt::Display for PackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PackError::Header => f.write_str("not a version 2 or 3 pack"),
            PackError::Truncated => f.write_str(
                "the pack ends before its objects do (its object count lies, or it is cut)",
            ),
            PackError::TrailingBytes => {
                f.write_str("bytes after the pack's objects (its object count lies)")
            }
            PackError::Checksum => f.write_str("the pack's checksum does not match"),
            PackError::BadObject(at, why) => write!(f, "object at offset {at}: {why}"),
            PackError::TooLarge(at) => {
                write!(f, "object at offset {at} is larger than egressd reads")
            }
            PackError::Budget => f.write_str("the pack inflates to more than egressd reads"),
            PackError::DeltaTooDeep(at) => write!(f, "object at offset {at}: delta chain too deep"),
            PackError::Zlib(at) => write!(f, "object at offset {at}: bad zlib data"),
        }
    }
}

enum Header {
    Base(Kind),
    /// Index of the base object.
    Ofs(usize),
    Ref(Oid),
}

struct Entry {
    offset: usize,
    header: Header,
    /// The declared (inflated) size.
    size: u64,
    /// The zlib stream.
    data: Range<usize>,
    /// Its type, when known as it is read.
    kind: Option<Kind>,
    /// Its delta chain's length, as read arriving.
    depth: usize,
}

/// An object's type and, for a commit or tree, its content.
type Held = (Kind, Option<Arc<[u8]>>);

/// A read pack.
pub struct Pack {
    /// Every object whose id could be worked out, with its type and, for
    /// commits and trees, its content.
    objects: HashMap<Oid, Held>,
    /// Objects whose delta base is not in the pack (a thin pack), or
    /// lies in a cycle.
    pub unresolved: usize,
    /// Objects the header declares (and the pack holds).
    pub count: u32,
    /// Bytes inflated and rebuilt reading it.
    pub inflated: u64,
}

/// A commit's tree and parents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    pub tree: Oid,
    pub parents: Vec<Oid>,
}

/// One tree entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeEntry<'a> {
    pub mode: u32,
    pub name: &'a [u8],
    pub id: Oid,
}

impl TreeEntry<'_> {
    pub fn is_tree(&self) -> bool {
        self.mode == 0o40000
    }
}

/// Where a pack's bytes come from while it is read: any `BufRead` (a
/// slice in memory, or a push body's chunks handed over as they arrive),
/// counted, and checksummed as they are consumed.
struct Tally<R> {
    inner: R,
    pos: usize,
    sum: Option<Sha1>,
}

impl<R: BufRead> Tally<R> {
    fn new(inner: R, sum: bool) -> Tally<R> {
        Tally {
            inner,
            pos: 0,
            sum: sum.then(Sha1::new),
        }
    }

    /// What is buffered; empty at the end (a failed read ends it too:
    /// what was not read is missing, and the reading says so).
    fn fill(&mut self) -> &[u8] {
        self.inner.fill_buf().unwrap_or(&[])
    }

    /// Consumes `n` of the bytes [`Tally::fill`] showed.
    fn take(&mut self, n: usize) {
        if let Some(s) = self.sum.as_mut() {
            s.update(&self.inner.fill_buf().unwrap_or(&[])[..n]);
        }
        self.inner.consume(n);
        self.pos += n;
    }

    fn byte(&mut self) -> Result<u8, PackError> {
        let b = *self.fill().first().ok_or(PackError::Truncated)?;
        self.take(1);
        Ok(b)
    }

    fn exact<const N: usize>(&mut self) -> Result<[u8; N], PackError> {
        let mut out = [0u8; N];
        for b in out.iter_mut() {
            *b = self.byte()?;
        }
        Ok(out)
    }
}

/// A reader that holds back its last 20 bytes (an arriving pack's
/// trailer) until its end: they are never handed out as objects.
struct HoldBack<R> {
    inner: R,
    buf: Vec<u8>,
    start: usize,
    end: bool,
}

impl<R: BufRead> HoldBack<R> {
    fn new(inner: R) -> HoldBack<R> {
        HoldBack {
            inner,
            buf: Vec::new(),
            start: 0,
            end: false,
        }
    }

    /// What was held back at the end.
    fn trailer(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

impl<R: BufRead> std::io::Read for HoldBack<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        read_through_buffer(self, out)
    }
}

/// `Read::read` for a reader whose `BufRead` side does the work.
pub fn read_through_buffer<R: BufRead>(r: &mut R, out: &mut [u8]) -> std::io::Result<usize> {
    let avail = r.fill_buf()?;
    let n = avail.len().min(out.len());
    out[..n].copy_from_slice(&avail[..n]);
    r.consume(n);
    Ok(n)
}

impl<R: BufRead> BufRead for HoldBack<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        while !self.end && self.buf.len() - self.start <= 20 {
            self.buf.drain(..self.start);
            self.start = 0;
            let chunk = self.inner.fill_buf()?;
            let n = chunk.len();
            self.end = n == 0;
            self.buf.extend_from_slice(chunk);
            self.inner.consume(n);
        }
        let upto = self.buf.len().saturating_sub(20).max(self.start);
        Ok(&self.buf[self.start..upto])
    }

    fn consume(&mut self, n: usize) {
        self.start += n;
    }
}

/// How a pack is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// As it arrives, for what git sends a server that asks for
    /// `ofs-delta` and `no-thin`: every delta's base is an earlier object,
    /// so each delta's type is known when it arrives. Commits and trees,
    /// and their deltas (applied at once onto their kept bases), are
    /// hashed and kept; blobs and tags and their deltas are inflated,
    /// bounded and held to their declared sizes, but neither hashed nor
    /// rebuilt: no check reads them, and a delta's offset proves its base
    /// is in the pack. A REF_DELTA ends this reading: the pack is then
    /// read whole.
    Arriving,
    /// Whole, from memory: every base object hashed, then every delta
    /// resolved from the bases outward, REF_DELTAs by id, as `git
    /// index-pack` does.
    Whole,
}

/// What reading a pack as it arrives came to.
pub enum Arrived {
    Read(Pack),
    /// It holds a REF_DELTA: once all of it is in, [`Pack::parse`] it.
    NeedsWhole,
}

/// Each object's type and id, where known.
type Ids = Vec<Option<(Kind, Oid)>>;

struct Reading {
    mode: Mode,
    entries: Vec<Entry>,
    by_offset: HashMap<usize, usize>,
    kept: HashMap<usize, (Kind, Arc<[u8]>)>,
    limits: Limits,
    inflated: u64,
    count: u32,
    z: Decompress,
    chunk: Box<[u8]>,
}

impl Pack {
    /// Reads `buf`, a whole pack (header, objects, trailer): as it would
    /// have arrived, or whole when it holds a REF_DELTA.
    pub fn parse(buf: &[u8], limits: Limits) -> Result<Pack, PackError> {
        let end = check_whole(buf)?;
        let mut r = Reading::new(Mode::Arriving, limits);
        match r.objects(&mut Tally::new(&buf[..end], false), Some(end))? {
            Some(ids) => Ok(r.into_pack(ids, 0)),
            None => Pack::parse_whole(buf, limits),
        }
    }

    /// Reads a pack from `input` as its bytes arrive (a blocking reader,
    /// fed a body's chunks as they come). The last 20 bytes are held back
    /// as the trailer, so a count that lies runs into the end, as it does
    /// in a pack read whole.
    pub fn read_arriving<R: BufRead>(input: R, limits: Limits) -> Result<Arrived, PackError> {
        let mut r = Reading::new(Mode::Arriving, limits);
        let mut t = Tally::new(HoldBack::new(input), true);
        let Some(ids) = r.objects(&mut t, None)? else {
            return Ok(Arrived::NeedsWhole);
        };
        if !t.fill().is_empty() {
            return Err(PackError::TrailingBytes);
        }
        let sum = t.sum.take().expect("summed").finalize();
        if t.inner.trailer() != sum.as_slice() {
            return Err(PackError::Checksum);
        }
        Ok(Arrived::Read(r.into_pack(ids, 0)))
    }

    /// Reads `buf` whole: any pack, REF_DELTAs included.
    pub fn parse_whole(buf: &[u8], limits: Limits) -> Result<Pack, PackError> {
        let end = check_whole(buf)?;
        let mut r = Reading::new(Mode::Whole, limits);
        let mut ids = r
            .objects(&mut Tally::new(&buf[..end], false), Some(end))?
            .expect("a whole reading reads every object");
        r.resolve_deltas(&buf[..end], &mut ids)?;
        let unresolved = ids.iter().filter(|id| id.is_none()).count();
        Ok(r.into_pack(ids, unresolved))
    }

    pub fn kind(&self, id: &Oid) -> Option<Kind> {
        self.objects.get(id).map(|(k, _)| *k)
    }

    /// Whether the pack holds `id` (read arriving, its commits and trees).
    pub fn contains(&self, id: &Oid) -> bool {
        self.objects.contains_key(id)
    }

    /// The commit `id`, if the pack holds it and it reads as one.
    pub fn commit(&self, id: &Oid) -> Option<Result<Commit, &'static str>> {
        match self.objects.get(id) {
            Some((Kind::Commit, Some(d))) => Some(parse_commit(d)),
            _ => None,
        }
    }

    /// The tree `id`'s raw content, if the pack holds it.
    pub fn tree(&self, id: &Oid) -> Option<&[u8]> {
        match self.objects.get(id) {
            Some((Kind::Tree, Some(d))) => Some(d),
            _ => None,
        }
    }

    /// Every commit the pack holds.
    pub fn commits(&self) -> impl Iterator<Item = &Oid> {
        self.objects
            .iter()
            .filter(|(_, (k, _))| *k == Kind::Commit)
            .map(|(id, _)| id)
    }
}

/// A whole pack's checksum, checked before any object is read; the
/// offset of its trailer.
fn check_whole(buf: &[u8]) -> Result<usize, PackError> {
    if buf.len() < 32 || &buf[..4] != b"PACK" {
        return Err(PackError::Header);
    }
    let end = buf.len() - 20;
    let mut sum = Sha1::new();
    sum.update(&buf[..end]);
    if sum.finalize().as_slice() != &buf[end..] {
        return Err(PackError::Checksum);
    }
    Ok(end)
}

impl Reading {
    fn new(mode: Mode, limits: Limits) -> Reading {
        Reading {
            mode,
            entries: Vec::new(),
            by_offset: HashMap::new(),
            kept: HashMap::new(),
            limits,
            inflated: 0,
            count: 0,
            z: Decompress::new(true),
            chunk: vec![0u8; 32 << 10].into_boxed_slice(),
        }
    }

    /// The header and every object, to `end` when it is known (a whole
    /// pack without its trailer); `None` when an arriving pack holds a
    /// REF_DELTA.
    fn objects<R: BufRead>(
        &mut self,
        t: &mut Tally<R>,
        end: Option<usize>,
    ) -> Result<Option<Ids>, PackError> {
        let head: [u8; 12] = t.exact().map_err(|_| PackError::Header)?;
        let version = u32::from_be_bytes(head[4..8].try_into().expect("4 bytes"));
        if &head[..4] != b"PACK" || (version != 2 && version != 3) {
            return Err(PackError::Header);
        }
        let count = u32::from_be_bytes(head[8..12].try_into().expect("4 bytes"));
        // Every object takes at least two bytes of header and eight of
        // zlib: a count beyond that is a lie, found before any allocation.
        if end.is_some_and(|end| count as usize > (end - 12) / 10) {
            return Err(PackError::Truncated);
        }
        self.count = count;
        let room = count.min(1 << 16) as usize;
        self.entries.reserve(room);
        let mut ids = Ids::with_capacity(room);
        for _ in 0..count {
            let Some(id) = self.read_entry(t)? else {
                return Ok(None);
            };
            self.by_offset
                .insert(self.entries.last().expect("read").offset, ids.len());
            ids.push(id);
        }
        if end.is_some_and(|end| t.pos != end) {
            return Err(PackError::TrailingBytes);
        }
        Ok(Some(ids))
    }

    fn into_pack(self, ids: Ids, unresolved: usize) -> Pack {
        let mut objects = HashMap::with_capacity(self.kept.len());
        let mut kept = self.kept;
        for (i, id) in ids.into_iter().enumerate() {
            if let Some((kind, oid)) = id {
                let data = kept.remove(&i).map(|(_, d)| d);
                objects.insert(oid, (kind, data));
            }
        }
        Pack {
            objects,
            unresolved,
            count: self.count,
            inflated: self.inflated,
        }
    }

    /// An entry's header: its type (or its delta base) and declared size.
    fn read_header<R: BufRead>(&self, t: &mut Tally<R>) -> Result<(Header, u64), PackError> {
        let pos = t.pos;
        let mut c = t.byte()?;
        let ty = (c >> 4) & 7;
        let mut size = u64::from(c & 15);
        let mut shift = 4;
        while c & 0x80 != 0 {
            c = t.byte()?;
            if shift > 57 {
                return Err(PackError::BadObject(pos, "size too long"));
            }
            size |= u64::from(c & 0x7f) << shift;
            shift += 7;
        }
        let header = match ty {
            1 => Header::Base(Kind::Commit),
            2 => Header::Base(Kind::Tree),
            3 => Header::Base(Kind::Blob),
            4 => Header::Base(Kind::Tag),
            6 => {
                let mut c = t.byte()?;
                let mut ofs = u64::from(c & 0x7f);
                while c & 0x80 != 0 {
                    c = t.byte()?;
                    ofs = ofs
                        .checked_add(1)
                        .and_then(|o| o.checked_mul(128))
                        .ok_or(PackError::BadObject(pos, "delta offset overflows"))?
                        | u64::from(c & 0x7f);
                }
                let base = (pos as u64)
                    .checked_sub(ofs)
                    .filter(|b| ofs > 0 && *b >= 12)
                    .ok_or(PackError::BadObject(pos, "delta base outside the pack"))?;
                let idx = *self
                    .by_offset
                    .get(&(base as usize))
                    .ok_or(PackError::BadObject(pos, "delta base is not an object"))?;
                Header::Ofs(idx)
            }
            7 => Header::Ref(t.exact()?),
            _ => return Err(PackError::BadObject(pos, "unknown object type")),
        };
        Ok((header, size))
    }

    /// The next entry, inflated; its type and id when they are worked out
    /// now. `None` when an arriving pack shows a REF_DELTA.
    fn read_entry<R: BufRead>(
        &mut self,
        t: &mut Tally<R>,
    ) -> Result<Option<Option<(Kind, Oid)>>, PackError> {
        let pos = t.pos;
        let (header, size) = self.read_header(t)?;
        let from = t.pos;
        let idx = self.entries.len();
        let mut depth = 0;
        let id = match (self.mode, &header) {
            (_, Header::Base(kind)) => {
                let kind = *kind;
                let hash = self.mode == Mode::Whole || kind != Kind::Blob;
                let keep = matches!(kind, Kind::Commit | Kind::Tree);
                let mut h = hash.then(|| {
                    let mut h = Sha1::new();
                    h.update(format!("{} {size}\0", kind.name()).as_bytes());
                    h
                });
                let data = self.inflate(t, pos, size, keep, h.as_mut())?;
                if let Some(d) = data {
                    self.kept.insert(idx, (kind, d.into()));
                }
                h.map(|h| (kind, h.finalize().into()))
            }
            (Mode::Arriving, Header::Ref(_)) => return Ok(None),
            (Mode::Arriving, Header::Ofs(base)) => {
                depth = self.entries[*base].depth + 1;
                if depth > self.limits.max_depth {
                    return Err(PackError::DeltaTooDeep(pos));
                }
                match self.kept.get(base).cloned() {
                    Some((kind, base)) => {
                        let delta = self.inflate(t, pos, size, true, None)?;
                        let out: Arc<[u8]> = self.apply(pos, &base, &delta.expect("kept"))?.into();
                        let oid = object_id(kind, &out);
                        self.kept.insert(idx, (kind, out));
                        Some((kind, oid))
                    }
                    None => {
                        self.inflate(t, pos, size, false, None)?;
                        None
                    }
                }
            }
            (Mode::Whole, _) => {
                self.inflate(t, pos, size, false, None)?;
                None
            }
        };
        let kind = match (&header, id) {
            (Header::Base(k), _) => Some(*k),
            (_, Some((k, _))) => Some(k),
            (Header::Ofs(b), None) => self.entries[*b].kind,
            (Header::Ref(_), None) => None,
        };
        self.entries.push(Entry {
            offset: pos,
            header,
            size,
            data: from..t.pos,
            kind,
            depth,
        });
        Ok(Some(id))
    }

    /// Inflates the zlib stream `t` is at, which must produce exactly
    /// `size` bytes; returns them when `keep`. Charged to the budget
    /// before a byte is produced.
    fn inflate<R: BufRead>(
        &mut self,
        t: &mut Tally<R>,
        at: usize,
        size: u64,
        keep: bool,
        mut hash: Option<&mut Sha1>,
    ) -> Result<Option<Vec<u8>>, PackError> {
        self.charge(at, size)?;
        self.z.reset(true);
        let mut out = keep.then(|| Vec::with_capacity(size as usize));
        let mut produced = 0u64;
        loop {
            let input = t.fill();
            let empty = input.is_empty();
            let (in0, out0) = (self.z.total_in(), self.z.total_out());
            let status = self
                .z
                .decompress(input, &mut self.chunk, FlushDecompress::None)
                .map_err(|_| PackError::Zlib(at))?;
            let used = (self.z.total_in() - in0) as usize;
            let n = (self.z.total_out() - out0) as usize;
            t.take(used);
            produced += n as u64;
            if produced > size {
                return Err(PackError::BadObject(at, "inflates past its declared size"));
            }
            if let Some(h) = hash.as_deref_mut() {
                h.update(&self.chunk[..n]);
            }
            if let Some(o) = out.as_mut() {
                o.extend_from_slice(&self.chunk[..n]);
            }
            match status {
                Status::StreamEnd => break,
                _ if n == 0 && used == 0 => {
                    return Err(if empty {
                        PackError::Truncated
                    } else {
                        PackError::Zlib(at)
                    })
                }
                _ => {}
            }
        }
        if produced != size {
            return Err(PackError::BadObject(
                at,
                "inflates short of its declared size",
            ));
        }
        Ok(out)
    }

    /// Inflates the stream of entry `i` again, from the whole pack `buf`.
    fn inflate_again(&mut self, buf: &[u8], i: usize) -> Result<Vec<u8>, PackError> {
        let e = &self.entries[i];
        let (at, size) = (e.offset, e.size);
        let mut t = Tally::new(&buf[e.data.clone()], false);
        Ok(self.inflate(&mut t, at, size, true, None)?.expect("kept"))
    }

    fn charge(&mut self, at: usize, size: u64) -> Result<(), PackError> {
        if size > self.limits.max_object {
            return Err(PackError::TooLarge(at));
        }
        self.inflated = self.inflated.saturating_add(size);
        if self.inflated > self.limits.max_inflated {
            return Err(PackError::Budget);
        }
        Ok(())
    }

    /// Every delta whose base is in the pack, resolved from the bases
    /// outward as `git index-pack` does: each base object is inflated once
    /// more, and each delta inflated and applied once, onto its base's
    /// content held while its children are worked (a chain of N deltas
    /// costs N applications, not the N²/2 of rebuilding each delta's chain
    /// from its root; issue #38's pack walk measured 1.7–2.6 MiB/s that
    /// way). A REF_DELTA's base may lie anywhere in the pack, as a base
    /// object or itself a delta: its children are found by id as soon as
    /// that id is known. What no base reaches (a thin pack's deltas, deltas
    /// naming each other) stays `None` in `ids`.
    fn resolve_deltas(
        &mut self,
        buf: &[u8],
        ids: &mut [Option<(Kind, Oid)>],
    ) -> Result<(), PackError> {
        let mut by_ofs: HashMap<usize, Vec<usize>> = HashMap::new();
        let mut by_ref: HashMap<Oid, Vec<usize>> = HashMap::new();
        for (i, e) in self.entries.iter().enumerate() {
            match e.header {
                Header::Ofs(b) => by_ofs.entry(b).or_default().push(i),
                Header::Ref(id) => by_ref.entry(id).or_default().push(i),
                Header::Base(_) => {}
            }
        }
        if by_ofs.is_empty() && by_ref.is_empty() {
            return Ok(());
        }
        // Children are taken once: a base that appears twice (the same
        // object stored twice) hands its REF_DELTAs to the first.
        let mut children = |i: usize, id: &Oid| -> Vec<usize> {
            let mut c = by_ofs.remove(&i).unwrap_or_default();
            c.extend(by_ref.remove(id).unwrap_or_default());
            c
        };
        /// A resolved object whose deltas are being worked.
        struct Frame {
            kind: Kind,
            data: Arc<[u8]>,
            children: Vec<usize>,
            depth: usize,
        }
        for root in 0..ids.len() {
            let (kind, id) = match (&self.entries[root].header, ids[root]) {
                (Header::Base(_), Some(known)) => known,
                _ => continue,
            };
            let kids = children(root, &id);
            if kids.is_empty() {
                continue;
            }
            let data = self.base_content(buf, root)?;
            let mut stack = vec![Frame {
                kind,
                data,
                children: kids,
                depth: 0,
            }];
            while let Some(top) = stack.last_mut() {
                let Some(child) = top.children.pop() else {
                    stack.pop();
                    continue;
                };
                let (kind, depth) = (top.kind, top.depth + 1);
                let at = self.entries[child].offset;
                if depth > self.limits.max_depth {
                    return Err(PackError::DeltaTooDeep(at));
                }
                let delta = self.inflate_again(buf, child)?;
                let base = stack.last().expect("the frame popped from").data.clone();
                let out: Arc<[u8]> = self.apply(at, &base, &delta)?.into();
                let oid = object_id(kind, &out);
                ids[child] = Some((kind, oid));
                if matches!(kind, Kind::Commit | Kind::Tree) {
                    self.kept.insert(child, (kind, out.clone()));
                }
                let kids = children(child, &oid);
                if !kids.is_empty() {
                    stack.push(Frame {
                        kind,
                        data: out,
                        children: kids,
                        depth,
                    });
                }
            }
        }
        Ok(())
    }

    /// A base object's content: kept (commits, trees), else inflated once
    /// more (a blob, hashed but not kept when first read).
    fn base_content(&mut self, buf: &[u8], root: usize) -> Result<Arc<[u8]>, PackError> {
        if let Some((_, d)) = self.kept.get(&root) {
            return Ok(d.clone());
        }
        Ok(self.inflate_again(buf, root)?.into())
    }

    /// A delta (gitformat-pack(5) "Deltified representation") applied to
    /// `base`, every copy bounded by it and the result by its declared size.
    fn apply(&mut self, at: usize, base: &[u8], delta: &[u8]) -> Result<Vec<u8>, PackError> {
        let bad = |why| PackError::BadObject(at, why);
        let mut p = 0;
        let varint = |p: &mut usize| -> Result<u64, PackError> {
            let mut v = 0u64;
            let mut shift = 0;
            loop {
                let c = *delta.get(*p).ok_or(bad("truncated delta"))?;
                *p += 1;
                if shift > 57 {
                    return Err(bad("delta size too long"));
                }
                v |= u64::from(c & 0x7f) << shift;
                shift += 7;
                if c & 0x80 == 0 {
                    return Ok(v);
                }
            }
        };
        let src_len = varint(&mut p)?;
        let dst_len = varint(&mut p)?;
        if src_len != base.len() as u64 {
            return Err(bad("delta base size does not match"));
        }
        self.charge(at, dst_len)?;
        let mut out = Vec::with_capacity(dst_len as usize);
        while p < delta.len() {
            let op = delta[p];
            p += 1;
            if op & 0x80 != 0 {
                let mut off = 0usize;
                let mut len = 0usize;
                for k in 0..4 {
                    if op & (1 << k) != 0 {
                        off |= usize::from(*delta.get(p).ok_or(bad("truncated delta"))?) << (8 * k);
                        p += 1;
                    }
                }
                for k in 0..3 {
                    if op & (0x10 << k) != 0 {
                        len |= usize::from(*delta.get(p).ok_or(bad("truncated delta"))?) << (8 * k);
                        p += 1;
                    }
                }
                if len == 0 {
                    len = 0x10000;
                }
                let src = off
                    .checked_add(len)
                    .and_then(|e| base.get(off..e))
                    .ok_or(bad("delta copies outside its base"))?;
                out.extend_from_slice(src);
            } else if op != 0 {
                let lit = delta
                    .get(p..p + usize::from(op))
                    .ok_or(bad("truncated delta"))?;
                out.extend_from_slice(lit);
                p += usize::from(op);
            } else {
                return Err(bad("delta opcode 0"));
            }
            if out.len() as u64 > dst_len {
                return Err(bad("delta result past its declared size"));
            }
        }
        if out.len() as u64 != dst_len {
            return Err(bad("delta result short of its declared size"));
        }
        Ok(out)
    }
}

/// The id git gives an object of `kind` holding `data`.
pub fn object_id(kind: Kind, data: &[u8]) -> Oid {
    let mut h = Sha1::new();
    h.update(format!("{} {}\0", kind.name(), data.len()).as_bytes());
    h.update(data);
    h.finalize().into()
}

/// A commit's `tree` and `parent` headers.
pub fn parse_commit(data: &[u8]) -> Result<Commit, &'static str> {
    let mut tree = None;
    let mut parents = Vec::new();
    for line in data.split(|&b| b == b'\n') {
        if line.is_empty() {
            break;
        }
        if let Some(h) = line.strip_prefix(b"tree ") {
            tree = Some(parse_hex(h).ok_or("bad tree id")?);
        } else if let Some(h) = line.strip_prefix(b"parent ") {
            parents.push(parse_hex(h).ok_or("bad parent id")?);
        }
    }
    Ok(Commit {
        tree: tree.ok_or("commit without a tree")?,
        parents,
    })
}

/// A tree's entries, in order; an error for a tree that does not read.
pub fn tree_entries(data: &[u8]) -> Result<Vec<TreeEntry<'_>>, &'static str> {
    let mut out = Vec::new();
    let mut p = 0;
    while p < data.len() {
        let sp = data[p..]
            .iter()
            .position(|&b| b == b' ')
            .ok_or("bad tree entry")?;
        let mode = std::str::from_utf8(&data[p..p + sp])
            .ok()
            .and_then(|m| u32::from_str_radix(m, 8).ok())
            .ok_or("bad tree mode")?;
        p += sp + 1;
        let nul = data[p..]
            .iter()
            .position(|&b| b == 0)
            .ok_or("bad tree entry")?;
        let name = &data[p..p + nul];
        p += nul + 1;
        let id = data.get(p..p + 20).ok_or("truncated tree")?;
        p += 20;
        out.push(TreeEntry {
            mode,
            name,
            id: id.try_into().expect("20 bytes"),
        });
    }
    Ok(out)
}

/// Forty hex digits as an id.
pub fn parse_hex(h: &[u8]) -> Option<Oid> {
    if h.len() != 40 {
        return None;
    }
    let mut out = [0u8; 20];
    for (i, pair) in h.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

/// An id as forty hex digits.
pub fn hex(id: &Oid) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
pub(crate) mod build {
    //! Packs built by hand, for the tests here and in `git`.
    use super::*;
    use std::io::Write;

    pub fn zlib(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    pub fn header(ty: u8, size: u64) -> Vec<u8> {
        let mut out = Vec::new();
        let mut c = (ty << 4) | (size & 15) as u8;
        let mut rest = size >> 4;
        while rest > 0 {
            out.push(c | 0x80);
            c = (rest & 0x7f) as u8;
            rest >>= 7;
        }
        out.push(c);
        out
    }

    /// Raw entries (header + zlib) as a pack claiming `count` objects.
    pub fn pack(count: u32, entries: &[Vec<u8>]) -> Vec<u8> {
        let mut out = b"PACK".to_vec();
        out.extend_from_slice(&2u32.to_be_bytes());
        out.extend_from_slice(&count.to_be_bytes());
        for e in entries {
            out.extend_from_slice(e);
        }
        let mut h = Sha1::new();
        h.update(&out);
        out.extend_from_slice(&h.finalize());
        out
    }

    pub fn object(kind: Kind, data: &[u8]) -> Vec<u8> {
        let ty = match kind {
            Kind::Commit => 1,
            Kind::Tree => 2,
            Kind::Blob => 3,
            Kind::Tag => 4,
        };
        let mut e = header(ty, data.len() as u64);
        e.extend(zlib(data));
        e
    }

    pub fn ref_delta(base: &Oid, delta: &[u8]) -> Vec<u8> {
        let mut e = header(7, delta.len() as u64);
        e.extend_from_slice(base);
        e.extend(zlib(delta));
        e
    }

    pub fn tree(entries: &[(&str, &str, Oid)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (mode, name, id) in entries {
            out.extend_from_slice(format!("{mode} {name}\0").as_bytes());
            out.extend_from_slice(id);
        }
        out
    }

    pub fn commit(tree: &Oid, parents: &[Oid]) -> Vec<u8> {
        let mut s = format!("tree {}\n", hex(tree));
        for p in parents {
            s.push_str(&format!("parent {}\n", hex(p)));
        }
        s.push_str("author a <a@x> 0 +0000\ncommitter a <a@x> 0 +0000\n\nm\n");
        s.into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::build::*;
    use super::*;

    fn limits() -> Limits {
        Limits::for_pack(1 << 20)
    }

    #[test]
    fn objects_ids_and_commits() {
        let blob = b"hello\n";
        let blob_id = object_id(Kind::Blob, blob);
        // `git hash-object` of "hello\n".
        assert_eq!(hex(&blob_id), "ce013625030ba8dba906f756967f9e9ca394464a");
        let tree = tree(&[("100644", "a.txt", blob_id)]);
        let tree_id = object_id(Kind::Tree, &tree);
        let c = commit(&tree_id, &[[7; 20]]);
        let c_id = object_id(Kind::Commit, &c);
        let p = pack(
            3,
            &[
                object(Kind::Blob, blob),
                object(Kind::Tree, &tree),
                object(Kind::Commit, &c),
            ],
        );
        // Read as it arrives, the blob is inflated but not hashed; read
        // whole, it is.
        assert_eq!(Pack::parse(&p, limits()).unwrap().kind(&blob_id), None);
        let whole = Pack::parse_whole(&p, limits()).unwrap();
        assert_eq!(whole.kind(&blob_id), Some(Kind::Blob));
        assert_eq!(whole.kind(&c_id), Some(Kind::Commit));
        let pack = Pack::parse(&p, limits()).unwrap();
        assert_eq!(pack.unresolved, 0);
        assert_eq!(pack.kind(&tree_id), Some(Kind::Tree));
        let got = pack.commit(&c_id).unwrap().unwrap();
        assert_eq!(got.tree, tree_id);
        assert_eq!(got.parents, vec![[7; 20]]);
        let entries = tree_entries(pack.tree(&tree_id).unwrap()).unwrap();
        assert_eq!(entries[0].name, b"a.txt");
    }

    #[test]
    fn a_delta_in_the_pack_resolves_and_one_outside_does_not() {
        let base = b"0123456789abcdef0123456789abcdef".to_vec();
        let base_id = object_id(Kind::Blob, &base);
        // Copy 16 bytes from offset 0, then insert "XY".
        let mut delta = vec![32, 18, 0x80 | 0x10, 16, 2, b'X', b'Y'];
        let want: Vec<u8> = [&base[..16], b"XY"].concat();
        let p = pack(
            3,
            &[
                object(Kind::Blob, &base),
                ref_delta(&base_id, &delta),
                ref_delta(&[9; 20], &delta),
            ],
        );
        let pack = Pack::parse(&p, limits()).unwrap();
        assert!(pack.contains(&object_id(Kind::Blob, &want)));
        assert_eq!(pack.unresolved, 1);
        // A copy past the base's end is refused.
        delta[3] = 40;
        let p = pack_of(&[object(Kind::Blob, &base), ref_delta(&base_id, &delta)]);
        assert!(matches!(
            Pack::parse(&p, limits()),
            Err(PackError::BadObject(_, _))
        ));
    }

    fn pack_of(entries: &[Vec<u8>]) -> Vec<u8> {
        pack(entries.len() as u32, entries)
    }

    /// A `BufRead` that hands out its bytes `n` at a time, as a body's
    /// frames arrive.
    struct Trickle<'a> {
        buf: &'a [u8],
        n: usize,
    }

    impl std::io::Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            let k = self.fill_buf()?.len().min(out.len());
            out[..k].copy_from_slice(&self.buf[..k]);
            self.consume(k);
            Ok(k)
        }
    }

    impl BufRead for Trickle<'_> {
        fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
            Ok(&self.buf[..self.n.min(self.buf.len())])
        }
        fn consume(&mut self, k: usize) {
            self.buf = &self.buf[k..];
        }
    }

    fn arriving(p: &[u8], n: usize) -> Result<Arrived, PackError> {
        Pack::read_arriving(Trickle { buf: p, n }, limits())
    }

    /// A tree stored as an OFS_DELTA on another tree, and a commit naming
    /// it: read as it arrives, a few bytes at a time, the delta is applied
    /// when it arrives and the pack answers as one read whole does.
    #[test]
    fn an_arriving_pack_resolves_its_tree_deltas_as_they_come() {
        let blob_id = object_id(Kind::Blob, b"x\n");
        let t1 = tree(&[("100644", "a.txt", blob_id)]);
        let t2 = tree(&[("100644", "a.txt", blob_id), ("100644", "b.txt", blob_id)]);
        let t2_id = object_id(Kind::Tree, &t2);
        let c = commit(&t2_id, &[]);
        let c_id = object_id(Kind::Commit, &c);
        // t2 = t1 whole, then b.txt's entry inserted.
        let mut d = Vec::new();
        varint(t1.len(), &mut d);
        varint(t2.len(), &mut d);
        d.extend([0x80 | 0x10, t1.len() as u8]);
        let add = &t2[t1.len()..];
        d.push(add.len() as u8);
        d.extend_from_slice(add);
        let first = object(Kind::Tree, &t1);
        let mut delta = header(6, d.len() as u64);
        delta.push(first.len() as u8);
        delta.extend(zlib(&d));
        let p = pack_of(&[
            first,
            delta,
            object(Kind::Blob, b"x\n"),
            object(Kind::Commit, &c),
        ]);
        for n in [1, 7, 1 << 20] {
            let Ok(Arrived::Read(pack)) = arriving(&p, n) else {
                panic!("read arriving {n} bytes at a time");
            };
            assert_eq!(pack.tree(&t2_id), Some(&t2[..]));
            assert_eq!(pack.commit(&c_id).unwrap().unwrap().tree, t2_id);
            assert_eq!(pack.unresolved, 0);
        }
        let whole = Pack::parse_whole(&p, limits()).unwrap();
        assert_eq!(whole.tree(&t2_id), Some(&t2[..]));
        // A REF_DELTA asks for the whole pack; bytes past the trailer and
        // a wrong checksum are refused.
        let base = object(Kind::Blob, b"x\n");
        let r = pack_of(&[base.clone(), ref_delta(&blob_id, &[2, 2, 0x90, 2])]);
        assert!(matches!(arriving(&r, 3), Ok(Arrived::NeedsWhole)));
        let mut extra = p.clone();
        extra.push(0);
        assert_eq!(arriving(&extra, 5).err(), Some(PackError::TrailingBytes));
        let mut bad = p.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert_eq!(arriving(&bad, 5).err(), Some(PackError::Checksum));
        assert_eq!(
            arriving(&p[..p.len() - 3], 5).err(),
            Some(PackError::Truncated)
        );
    }

    #[test]
    fn a_count_that_lies_is_refused() {
        let one = object(Kind::Blob, b"x");
        assert_eq!(
            Pack::parse(&pack(2, std::slice::from_ref(&one)), limits()).err(),
            Some(PackError::Truncated)
        );
        assert_eq!(
            Pack::parse(&pack(1, &[one.clone(), one.clone()]), limits()).err(),
            Some(PackError::TrailingBytes)
        );
        // A count of four billion costs nothing before it is refused.
        assert_eq!(
            Pack::parse(&pack(u32::MAX, &[one]), limits()).err(),
            Some(PackError::Truncated)
        );
    }

    #[test]
    fn a_corrupt_checksum_or_cut_stream_is_refused() {
        let mut p = pack_of(&[object(Kind::Blob, b"hello")]);
        let n = p.len();
        p[n - 1] ^= 1;
        assert_eq!(Pack::parse(&p, limits()).err(), Some(PackError::Checksum));
        // The zlib stream cut short (checksum recomputed).
        let mut o = object(Kind::Blob, b"hello world, hello world");
        o.truncate(o.len() - 6);
        let p = pack_of(&[o]);
        assert!(Pack::parse(&p, limits()).is_err());
    }

    #[test]
    fn a_zip_bomb_stops_at_its_declared_size_and_the_budget() {
        let big = vec![0u8; 8 << 20];
        // Declared as 100 bytes, inflates to 8 MiB: refused at byte 101.
        let mut o = header(3, 100);
        o.extend(zlib(&big));
        let p = pack_of(&[o]);
        assert!(matches!(
            Pack::parse(&p, limits()),
            Err(PackError::BadObject(_, "inflates past its declared size"))
        ));
        // Declared honestly, but past the object bound.
        let small = Limits {
            max_object: 1 << 20,
            max_inflated: 4 << 20,
            max_depth: 8,
        };
        let p = pack_of(&[object(Kind::Blob, &big)]);
        assert!(matches!(
            Pack::parse(&p, small),
            Err(PackError::TooLarge(_))
        ));
        // Many objects, each within bound, together past the budget.
        let mb = vec![1u8; 1 << 20];
        let objs: Vec<Vec<u8>> = (0..5).map(|_| object(Kind::Blob, &mb)).collect();
        assert_eq!(
            Pack::parse(&pack_of(&objs), small).err(),
            Some(PackError::Budget)
        );
    }

    /// A varint as deltas write their sizes.
    fn varint(mut v: usize, out: &mut Vec<u8>) {
        loop {
            let c = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(c);
                return;
            }
            out.push(c | 0x80);
        }
    }

    /// A chain of 60 REF_DELTAs, each on the one before and stored before
    /// it (children first): every link resolves, and each is rebuilt once,
    /// so what is inflated grows with the chain, not with its square.
    #[test]
    fn a_long_chain_resolves_in_any_order_with_each_delta_applied_once() {
        let base: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        let mut contents = vec![base.clone()];
        let mut deltas = Vec::new();
        for k in 0..60u8 {
            let prev = contents.last().unwrap().clone();
            // Copy the whole base (offset 0, a three-byte length), add one byte.
            let mut d = Vec::new();
            varint(prev.len(), &mut d);
            varint(prev.len() + 1, &mut d);
            let n = prev.len();
            d.extend([0x80 | 0x70, n as u8, (n >> 8) as u8, (n >> 16) as u8]);
            d.extend([1, k]);
            deltas.push(ref_delta(&object_id(Kind::Blob, &prev), &d));
            contents.push([prev.as_slice(), &[k]].concat());
        }
        let mut entries: Vec<Vec<u8>> = deltas.into_iter().rev().collect();
        entries.push(object(Kind::Blob, &base));
        let pack = Pack::parse(&pack_of(&entries), limits()).unwrap();
        assert_eq!(pack.unresolved, 0);
        for c in &contents {
            assert!(pack.contains(&object_id(Kind::Blob, c)));
        }
        // Read once, the base again as a root, each delta and its result
        // once: about 62 objects of 4 KiB. Rebuilding each link's chain
        // from the root would inflate about 61·62/2 of them.
        let once: u64 = contents.iter().map(|c| c.len() as u64 + 16).sum::<u64>() + 2 * 4096;
        assert!(
            pack.inflated <= once,
            "inflated {} bytes, more than once each ({once})",
            pack.inflated
        );
    }

    #[test]
    fn delta_loops_do_not_resolve_and_deep_chains_are_refused() {
        // Two REF_DELTAs naming each other's (would-be) ids, and one
        // naming itself: none resolves, nothing loops.
        let d = vec![1, 1, 1, b'a'];
        let p = pack_of(&[ref_delta(&[1; 20], &d), ref_delta(&[2; 20], &d)]);
        let pack = Pack::parse(&p, limits()).unwrap();
        assert_eq!(pack.unresolved, 2);
        // A chain of OFS_DELTAs longer than max_depth.
        let base = b"a".to_vec();
        let mut entries = vec![object(Kind::Blob, &base)];
        let mut offsets = vec![12usize];
        let mut pos = 12 + entries[0].len();
        for _ in 0..10 {
            let mut e = header(6, 5);
            let ofs = pos - offsets.last().unwrap();
            assert!(ofs < 128);
            e.push(ofs as u8);
            e.extend(zlib(&[1, 1, 0x91, 0, 1]));
            offsets.push(pos);
            pos += e.len();
            entries.push(e);
        }
        let shallow = Limits {
            max_depth: 4,
            ..limits()
        };
        assert!(matches!(
            Pack::parse(&pack_of(&entries), shallow),
            Err(PackError::DeltaTooDeep(_))
        ));
        assert_eq!(
            Pack::parse(&pack_of(&entries), limits())
                .unwrap()
                .unresolved,
            0
        );
    }
}
