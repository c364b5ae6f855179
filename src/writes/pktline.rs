//! git's pkt-line framing (gitprotocol-common(5)), read from a body
//! already in memory and bounded by it: four hex digits of length
//! (including themselves), `0000` flush, `0001` delim, `0002`
//! response-end; at most 65520 bytes a line. A length that runs past the
//! end, is not hex, or is too large is an error, never a wait.

use std::fmt;

/// The largest pkt-line, length digits included.
pub const MAX_PKT_LEN: usize = 65520;

/// One pkt-line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pkt<'a> {
    Flush,
    Delim,
    ResponseEnd,
    Data(&'a [u8]),
}

/// Why a pkt-line stream cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PktError {
    /// Fewer bytes than the length says (or than the four digits).
    Truncated,
    /// Length digits that are not hex, or `0003`.
    BadLength,
    /// Longer than [`MAX_PKT_LEN`].
    TooLong(usize),
}

impl fmt::Display for PktError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PktError::Truncated => f.write_str("truncated pkt-line"),
            PktError::BadLength => f.write_str("bad pkt-line length"),
            PktError::TooLong(n) => write!(f, "pkt-line of {n} bytes (at most {MAX_PKT_LEN})"),
        }
    }
}

/// Reads pkt-lines from `buf`, advancing past each.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }

    /// Bytes read so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// What follows the last line read.
    pub fn rest(&self) -> &'a [u8] {
        &self.buf[self.pos..]
    }

    /// The next line; `Ok(None)` at the end of the buffer.
    pub fn next_pkt(&mut self) -> Result<Option<Pkt<'a>>, PktError> {
        let rest = &self.buf[self.pos..];
        if rest.is_empty() {
            return Ok(None);
        }
        let digits = rest.get(..4).ok_or(PktError::Truncated)?;
        let mut len = 0usize;
        for &d in digits {
            let v = (d as char).to_digit(16).ok_or(PktError::BadLength)?;
            len = len * 16 + v as usize;
        }
        let pkt = match len {
            0 => Pkt::Flush,
            1 => Pkt::Delim,
            2 => Pkt::ResponseEnd,
            3 => return Err(PktError::BadLength),
            n if n > MAX_PKT_LEN => return Err(PktError::TooLong(n)),
            n => Pkt::Data(rest.get(4..n).ok_or(PktError::Truncated)?),
        };
        self.pos += match pkt {
            Pkt::Data(d) => 4 + d.len(),
            _ => 4,
        };
        Ok(Some(pkt))
    }
}

/// `data` as one pkt-line, appended to `out`. Longer data is split.
pub fn write(out: &mut Vec<u8>, data: &[u8]) {
    for chunk in data.chunks(MAX_PKT_LEN - 4) {
        out.extend_from_slice(format!("{:04x}", chunk.len() + 4).as_bytes());
        out.extend_from_slice(chunk);
    }
}

/// A flush-pkt, appended to `out`.
pub fn flush(out: &mut Vec<u8>) {
    out.extend_from_slice(b"0000");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_flushes_and_their_errors() {
        let mut r = Reader::new(b"0009hello0000000100020004");
        assert_eq!(r.next_pkt(), Ok(Some(Pkt::Data(b"hello"))));
        assert_eq!(r.next_pkt(), Ok(Some(Pkt::Flush)));
        assert_eq!(r.next_pkt(), Ok(Some(Pkt::Delim)));
        assert_eq!(r.next_pkt(), Ok(Some(Pkt::ResponseEnd)));
        assert_eq!(r.next_pkt(), Ok(Some(Pkt::Data(b""))));
        assert_eq!(r.next_pkt(), Ok(None));
        assert_eq!(Reader::new(b"00").next_pkt(), Err(PktError::Truncated));
        assert_eq!(
            Reader::new(b"0010short").next_pkt(),
            Err(PktError::Truncated)
        );
        assert_eq!(Reader::new(b"zzzz").next_pkt(), Err(PktError::BadLength));
        assert_eq!(Reader::new(b"0003").next_pkt(), Err(PktError::BadLength));
        assert_eq!(
            Reader::new(b"fff1xxxx").next_pkt(),
            Err(PktError::TooLong(0xfff1))
        );
    }

    #[test]
    fn written_lines_read_back() {
        let mut out = Vec::new();
        write(&mut out, b"unpack ok\n");
        flush(&mut out);
        let mut r = Reader::new(&out);
        assert_eq!(r.next_pkt(), Ok(Some(Pkt::Data(b"unpack ok\n"))));
        assert_eq!(r.next_pkt(), Ok(Some(Pkt::Flush)));
    }
}
