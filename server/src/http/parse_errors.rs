//! JSON bodies for the answers hyper gives by itself. A request hyper cannot parse (bad method,
//! header or framing: 400; headers over `--max-header-bytes`: 431; a URI over 64 KiB: 414) never
//! reaches axum: hyper writes the status with an empty body and closes, and offers no hook. This
//! wrapper around a connection's stream rewrites exactly those responses — the only ones with an
//! error status and `content-length: 0`, since every error tally writes has a JSON body.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use axum::http::StatusCode;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::error::ApiError;

pub struct JsonParseErrors<S> {
    inner: S,
    /// A rewritten response not yet fully written, and how much of it was.
    pending: Vec<u8>,
    written: usize,
}

impl<S> JsonParseErrors<S> {
    pub fn new(inner: S) -> Self {
        JsonParseErrors { inner, pending: Vec::new(), written: 0 }
    }
}

impl<S: AsyncWrite + Unpin> JsonParseErrors<S> {
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.pending.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.pending.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for JsonParseErrors<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        if let Some(rewritten) = with_json_body(buf) {
            // Taken whole; flush (which hyper calls next) writes whatever is left of it.
            this.pending = rewritten;
            if let Poll::Ready(Err(error)) = this.poll_pending(cx) {
                return Poll::Ready(Err(error));
            }
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let mut non_empty = bufs.iter().filter(|b| !b.is_empty());
        if let (Some(only), None) = (non_empty.next(), non_empty.next()) {
            return self.poll_write(cx, only);
        }
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for JsonParseErrors<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

/// `response` with a JSON error body, if it is an error status line and headers with
/// `content-length: 0` and nothing after them.
fn with_json_body(response: &[u8]) -> Option<Vec<u8>> {
    let head = response.strip_prefix(b"HTTP/1.1 ")?.strip_suffix(b"\r\n\r\n")?;
    let status = StatusCode::from_bytes(head.get(..3)?).ok()?;
    if !status.is_client_error() && !status.is_server_error() {
        return None;
    }
    let head = std::str::from_utf8(head).ok()?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    let headers: Vec<&str> = lines.collect();
    let is_empty_length = |line: &&str| line.split_once(':').is_some_and(|(name, value)| name.eq_ignore_ascii_case("content-length") && value.trim() == "0");
    if !headers.iter().any(is_empty_length) {
        return None;
    }
    let message = match status {
        StatusCode::BAD_REQUEST => "malformed HTTP request: bad method, URI, header or body framing",
        StatusCode::URI_TOO_LONG => "request URI too long",
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => "request headers too large (see --max-header-bytes)",
        other => other.canonical_reason().unwrap_or("error"),
    };
    let body = ApiError::new(status, message).to_json();
    let mut out = format!("HTTP/1.1 {status_line}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n", body.len());
    for header in headers.iter().filter(|line| !is_empty_length(line)) {
        out.push_str(header);
        out.push_str("\r\n");
    }
    out.push_str("\r\n");
    out.push_str(&body);
    Some(out.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::with_json_body;

    #[test]
    fn only_empty_error_responses_get_a_body() {
        let hyper_431 = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: Sun, 22 Nov 2026 10:00:00 GMT\r\n\r\n";
        let rewritten = String::from_utf8(with_json_body(hyper_431).unwrap()).unwrap();
        let (head, body) = rewritten.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"), "{head}");
        assert!(head.contains(&format!("content-length: {}\r\n", body.len())) && head.ends_with("date: Sun, 22 Nov 2026 10:00:00 GMT"), "{head}");
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!((body["object"].as_str(), body["code"].as_u64()), (Some("error"), Some(431)));

        for untouched in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"[..],
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n{}",
            b"HTTP/1.1 400 Bad Req",
            b"{\"scores\": []}",
        ] {
            assert!(with_json_body(untouched).is_none(), "{}", String::from_utf8_lossy(untouched));
        }
    }
}
