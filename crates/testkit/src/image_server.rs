//! A small HTTP/1.1 server for image downloads, written on raw TCP so it can also misbehave
//! the ways mirrors do: refuse HEAD, answer without a length, end a body early, fail.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

/// How the server answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Serve {
    /// The image, with its length, for HEAD and GET.
    Image,
    /// This status with an empty body, for HEAD and GET.
    Status(u16),
    /// GET: the image without a `Content-Length` (the connection's end ends it).
    NoLength,
    /// GET: the full `Content-Length`, then only this many bytes and the connection closed.
    Truncate(usize),
    /// HEAD is refused with 405; GET serves the image.
    HeadRefused,
    /// HEAD answers 200 with `Content-Length: 0`; GET serves the image.
    HeadZero,
    /// HEAD announces this length; GET serves the image (a mirror that changed in between).
    HeadLength(u64),
    /// HEAD and GET announce this length, and GET sends the image (a lying mirror).
    Claim(u64),
    /// HEAD and GET are redirected (302) to this URL.
    Redirect(String),
    /// GET: the full `Content-Length` and the first this many bytes, then nothing until
    /// [`ImageServer::resume`], then the rest (a download held at a point the test chooses).
    PauseAfter(usize),
}

#[derive(Debug)]
struct State {
    serve: Serve,
    image: Arc<Vec<u8>>,
    gets: usize,
    heads: usize,
}

/// Where a [`Serve::PauseAfter`] body stands: true while one is held at its pause point.
#[derive(Debug, Clone)]
struct Pause {
    held: tokio::sync::watch::Sender<bool>,
    resumed: tokio::sync::watch::Sender<bool>,
}

/// The running server; it stops when dropped.
#[derive(Debug)]
pub struct ImageServer {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    pause: Pause,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ImageServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ImageServer {
    /// Serves `image` on `bind` (port 0 for any).
    pub async fn start(image: Vec<u8>, bind: &str) -> Self {
        let listener = TcpListener::bind(bind).await.expect("bind the image server");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State {
            serve: Serve::Image,
            image: Arc::new(image),
            gets: 0,
            heads: 0,
        }));
        let pause = Pause {
            held: tokio::sync::watch::channel(false).0,
            resumed: tokio::sync::watch::channel(false).0,
        };
        let (shared, paused) = (state.clone(), pause.clone());
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(answer(conn, shared.clone(), paused.clone()));
            }
        });
        Self {
            addr,
            state,
            pause,
            task,
        }
    }

    /// Resolves once a [`Serve::PauseAfter`] body is held at its pause point.
    pub async fn held(&self) {
        let mut held = self.pause.held.subscribe();
        // The sender lives in self, so the wait cannot fail.
        let _ = held.wait_for(|h| *h).await;
    }

    /// Lets every held body (and any later one) go on.
    pub fn resume(&self) {
        self.pause.resumed.send_replace(true);
    }

    /// The image's URL.
    pub fn url(&self) -> String {
        format!("http://{}/image.qcow2", self.addr)
    }

    /// Changes how the server answers.
    pub fn serve(&self, serve: Serve) {
        self.state.lock().unwrap().serve = serve;
    }

    /// GET requests so far.
    pub fn gets(&self) -> usize {
        self.state.lock().unwrap().gets
    }

    /// HEAD and GET requests so far.
    pub fn requests(&self) -> usize {
        let st = self.state.lock().unwrap();
        st.gets + st.heads
    }
}

async fn answer(mut conn: tokio::net::TcpStream, state: Arc<Mutex<State>>, pause: Pause) {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if head.len() > 16 << 10 {
            return;
        }
    }
    let is_head = head.starts_with(b"HEAD ");
    let (serve, image) = {
        let mut st = state.lock().unwrap();
        if is_head {
            st.heads += 1;
        } else {
            st.gets += 1;
        }
        (st.serve.clone(), st.image.clone())
    };
    let ok = |length: Option<usize>| match length {
        Some(n) => format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n"),
        None => "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".to_owned(),
    };
    let (header, body): (String, &[u8]) = match (serve, is_head) {
        (Serve::Status(code), _) => (
            format!("HTTP/1.1 {code} Status\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
            &[],
        ),
        (Serve::Redirect(to), _) => (
            format!("HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
            &[],
        ),
        (Serve::HeadRefused, true) => (
            "HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned(),
            &[],
        ),
        (Serve::HeadZero, true) => (ok(Some(0)), &[]),
        (Serve::Claim(n), _) => (
            format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n"),
            if is_head { &[] } else { &image[..] },
        ),
        (Serve::HeadLength(n), true) => (
            format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n"),
            &[],
        ),
        (Serve::PauseAfter(n), false) => {
            let n = n.min(image.len());
            let _ = conn.write_all(ok(Some(image.len())).as_bytes()).await;
            if conn.write_all(&image[..n]).await.is_err() {
                return;
            }
            pause.held.send_replace(true);
            let mut resumed = pause.resumed.subscribe();
            let _ = resumed.wait_for(|r| *r).await;
            (String::new(), &image[n..])
        }
        (Serve::NoLength, false) => (ok(None), &image[..]),
        (Serve::Truncate(n), false) => (ok(Some(image.len())), &image[..n.min(image.len())]),
        (_, true) => (ok(Some(image.len())), &[]),
        (_, false) => (ok(Some(image.len())), &image[..]),
    };
    let _ = conn.write_all(header.as_bytes()).await;
    let _ = conn.write_all(body).await;
    let _ = conn.shutdown().await;
}
