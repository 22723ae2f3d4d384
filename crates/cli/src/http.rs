//! The CLI's HTTP stack: tokio, hyper and axum, shared by the Prometheus endpoint of
//! `nrt monitor` and the LLM server.
//!
//! One client never holds up another: every connection is its own task; at most
//! [`Limits::max_connections`] are served at once (past that a new connection is closed at
//! once, so a flood of idle sockets costs no scrape more than the cap's worth of tasks); a
//! request head must arrive within [`Limits::header_timeout`] (a client sending a byte a
//! second is dropped, not waited on); and a whole connection, reading the request and
//! writing the response, ends by [`Limits::connection_deadline`] (a client that stops
//! reading does not hold a task forever). Servers bind where they are told (the tests and
//! docs use 127.0.0.1).

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// How much one server lets its clients hold.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections served at once.
    pub max_connections: usize,
    /// Time to receive a request's head.
    pub header_timeout: Duration,
    /// Time a connection may live (`None`: no limit, for streaming responses, whose
    /// handlers bound themselves).
    pub connection_deadline: Option<Duration>,
}

impl Limits {
    /// A metrics endpoint: small answers, scraped every few seconds.
    pub const METRICS: Limits = Limits {
        max_connections: 256,
        header_timeout: Duration::from_secs(5),
        connection_deadline: Some(Duration::from_secs(30)),
    };

    /// The LLM server: many clients, streams as long as a generation (the handlers bound the
    /// body's arrival and the engine every execution).
    pub const LLM: Limits = Limits {
        max_connections: 1024,
        header_timeout: Duration::from_secs(10),
        connection_deadline: None,
    };
}

/// A running server: its address; dropping it leaves it running until the process ends
/// (the CLI's servers live as long as their command).
#[derive(Debug)]
pub struct Server {
    /// Where it listens.
    pub addr: SocketAddr,
}

/// Binds `addr` and serves `router` on a thread of its own (a current-thread tokio runtime:
/// the handlers only copy prepared text or hand work to the engine).
pub fn spawn(addr: &str, router: axum::Router, limits: Limits) -> Result<Server, String> {
    let std_listener = std::net::TcpListener::bind(addr).map_err(|e| format!("{addr}: {e}"))?;
    let local = std_listener.local_addr().map_err(|e| e.to_string())?;
    std_listener
        .set_nonblocking(true)
        .map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the HTTP server's runtime: {e}"))?;
    std::thread::Builder::new()
        .name("nrt-http".into())
        .spawn(move || {
            rt.block_on(async move {
                match tokio::net::TcpListener::from_std(std_listener) {
                    Ok(l) => accept_loop(l, router, limits).await,
                    Err(e) => eprintln!("nrt: HTTP server on {local}: {e}"),
                }
            })
        })
        .map_err(|e| format!("cannot start the HTTP server's thread: {e}"))?;
    Ok(Server { addr: local })
}

async fn accept_loop(listener: tokio::net::TcpListener, router: axum::Router, limits: Limits) {
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(_) => {
                // Out of descriptors and the like: back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            drop(stream); // over the cap: closed at once
            continue;
        };
        let service = TowerToHyperService::new(router.clone());
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(TokioIo::new(stream), service);
            match limits.connection_deadline {
                Some(d) => {
                    let _ = tokio::time::timeout(d, conn).await;
                }
                None => {
                    let _ = conn.await;
                }
            }
            drop(slot);
        });
    }
}
