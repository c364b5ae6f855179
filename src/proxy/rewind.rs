//! A client socket with the bytes already read from it put back in front:
//! how the forward proxy's fast path ([`super::fast`]) hands a connection
//! to hyper at a request it does not serve itself, with that request's
//! bytes (and anything pipelined behind them) unread as far as hyper can
//! tell.
//!
//! The same replay serves a CONNECT tunnel whose first bytes were read to
//! tell TLS from plain HTTP before interception takes the stream.
//!
//! Owns only the replay. Does not own what the bytes are.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// `inner`, read from `pre[pos..]` first.
pub struct Rewind<S = TcpStream> {
    pre: Vec<u8>,
    pos: usize,
    inner: S,
}

impl<S> Rewind<S> {
    pub fn new(inner: S, pre: Vec<u8>) -> Rewind<S> {
        Rewind { pre, pos: 0, inner }
    }

    /// The stream, and the bytes put back that no reader has taken yet.
    pub fn into_parts(mut self) -> (S, Vec<u8>) {
        self.pre.drain(..self.pos);
        (self.inner, self.pre)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.pos < this.pre.len() {
            let n = (this.pre.len() - this.pos).min(buf.remaining());
            buf.put_slice(&this.pre[this.pos..this.pos + n]);
            this.pos += n;
            if this.pos == this.pre.len() {
                // Replayed: the memory is not kept for the connection's life.
                this.pre = Vec::new();
                this.pos = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn put_back_bytes_come_first_then_the_socket() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        c.write_all(b" world").await.unwrap();
        drop(c);
        let mut r = Rewind::new(s, b"hello".to_vec());
        let mut got = Vec::new();
        let mut small = [0u8; 3];
        let n = r.read(&mut small).await.unwrap();
        got.extend_from_slice(&small[..n]);
        let (mut s, rest) = r.into_parts();
        assert_eq!(rest, b"lo");
        got.extend_from_slice(&rest);
        s.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"hello world");
    }

    #[tokio::test]
    async fn a_reader_that_reads_to_the_end_gets_everything_in_order() {
        let inner: &[u8] = b" world";
        let mut r = Rewind::new(inner, b"hello".to_vec());
        let mut out = String::new();
        r.read_to_string(&mut out).await.unwrap();
        assert_eq!(out, "hello world");
    }
}
