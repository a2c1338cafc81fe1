//! A PMI-1 server on a thread of rank 0, for launchers that offer none
//! (`srun --mpi=none`). It runs the same state machine as ibrun's server,
//! on the same epoll loop: a wakeup costs what is ready. Without a launcher
//! to watch the tasks, a task is lost when its connection closes before
//! finalize; the subscribed tasks are told at once.

use std::net::TcpListener;
use std::thread::JoinHandle;

use crate::conns::{Conns, Stream};
use crate::poller::{Interest, Poller};
use crate::server::{Action, PmiServer, ServerConfig};

const LISTENER: u64 = 0;
const CONN_BASE: u64 = 1;

/// Serves until every rank has finalized or gone away.
pub fn spawn(listener: TcpListener, cfg: ServerConfig) -> std::io::Result<JoinHandle<()>> {
    listener.set_nonblocking(true)?;
    let poller = Poller::new()?;
    poller.add(&listener, LISTENER, Interest::Read)?;
    std::thread::Builder::new()
        .name("ibcoll-kvs".into())
        .spawn(move || serve(listener, poller, cfg))
}

fn serve(listener: TcpListener, mut poller: Poller, cfg: ServerConfig) {
    let size = cfg.size;
    let mut server = PmiServer::new(cfg);
    let mut conns = Conns::new(CONN_BASE);
    let mut done = 0usize; // ranks that finalized or disconnected after joining
    let mut buf = vec![0u8; 16 * 1024];
    while done < size {
        let ready = match poller.wait(None) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("ibcoll: key-value server: epoll failed: {e}");
                return;
            }
        };
        for ev in ready {
            if ev.token == LISTENER {
                while let Ok((s, _)) = listener.accept() {
                    match conns.add(&poller, Stream::Tcp(s)) {
                        Ok(id) => server.add_conn(id, None),
                        Err(e) => eprintln!("ibcoll: key-value server: {e}"),
                    }
                }
                continue;
            }
            let Some(id) = conns.id_of(ev.token) else {
                continue;
            };
            if ev.writable {
                conns.flush(&poller, id);
            }
            if !(ev.readable || ev.closed) {
                continue;
            }
            let got = conns.read(id, &mut buf);
            for line in got.lines {
                let actions = match line {
                    Ok(l) => server.handle_line(id, &l),
                    Err(e) => vec![Action::Log(format!("PMI: connection {id}: {e}"))],
                };
                done += apply(&poller, &mut conns, actions);
            }
            if got.closed {
                if server.rank_of(id).is_some() && !server.is_finalized(id) {
                    done += 1;
                }
                let actions = server.remove_conn(id);
                conns.remove(&poller, id);
                done += apply(&poller, &mut conns, actions);
            }
        }
    }
    conns.drain(std::time::Duration::from_secs(10));
}

/// Carries out the server's actions; returns how many ranks finalized.
fn apply(poller: &Poller, conns: &mut Conns, actions: Vec<Action>) -> usize {
    let mut finalized = 0;
    for a in actions {
        match a {
            Action::Reply(to, text) => conns.send(poller, to, text.as_bytes()),
            Action::Log(m) => eprintln!("ibcoll: {m}"),
            Action::Finalized(_) => finalized += 1,
            // Without ibrun nobody gathers the watchdog states: every
            // rank's error carries its own report.
            Action::Hang { .. } => {}
            Action::Abort {
                rank,
                exit_code,
                message,
            } => {
                eprintln!(
                    "ibcoll: rank {} called abort with exit code {exit_code}: {message}; ending the job",
                    rank.map_or("?".into(), |r| r.to_string())
                );
                // Without a launcher to kill the others, ending the server's
                // process makes every peer's next PMI call, and its ibcoll
                // channels, fail.
                std::process::exit(if exit_code == 0 { 1 } else { exit_code });
            }
        }
    }
    finalized
}
