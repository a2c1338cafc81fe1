//! A PMI-1 server on a thread of rank 0, for launchers that offer none
//! (`srun --mpi=none`). It runs the same state machine as ibrun's server.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::server::{Action, ConnId, PmiServer, ServerConfig};
use crate::wire::LineBuffer;

struct Conn {
    stream: TcpStream,
    lines: LineBuffer,
}

/// Serves until every rank has finalized or gone away.
pub fn spawn(listener: TcpListener, cfg: ServerConfig) -> std::io::Result<JoinHandle<()>> {
    listener.set_nonblocking(true)?;
    std::thread::Builder::new()
        .name("ibcoll-kvs".into())
        .spawn(move || serve(listener, cfg))
}

fn serve(listener: TcpListener, cfg: ServerConfig) {
    let size = cfg.size;
    let mut server = PmiServer::new(cfg);
    let mut conns: HashMap<ConnId, Conn> = HashMap::new();
    let mut next: ConnId = 0;
    let mut done = 0usize; // ranks that finalized or disconnected after joining
    let mut buf = vec![0u8; 16 * 1024];
    while done < size {
        let mut fds = vec![libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        let ids: Vec<ConnId> = conns.keys().copied().collect();
        for id in &ids {
            fds.push(libc::pollfd {
                fd: conns[id].stream.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        // SAFETY: a valid pollfd array with its true length; every descriptor
        // is owned by `listener` or `conns`, which outlive the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 1000) };
        if n <= 0 {
            continue;
        }
        if fds[0].revents != 0 {
            while let Ok((s, _)) = listener.accept() {
                let _ = s.set_nonblocking(true);
                let _ = s.set_nodelay(true);
                let _ = s.set_write_timeout(Some(Duration::from_secs(10)));
                server.add_conn(next, None);
                conns.insert(
                    next,
                    Conn {
                        stream: s,
                        lines: LineBuffer::new(),
                    },
                );
                next += 1;
            }
        }
        for (pfd, id) in fds[1..].iter().zip(ids) {
            if pfd.revents == 0 {
                continue;
            }
            let mut closed = false;
            let mut lines = Vec::new();
            if let Some(c) = conns.get_mut(&id) {
                loop {
                    match c.stream.read(&mut buf) {
                        Ok(0) => {
                            closed = true;
                            break;
                        }
                        Ok(k) => c.lines.extend(&buf[..k]),
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                        Err(_) => {
                            closed = true;
                            break;
                        }
                    }
                }
                while let Ok(Some(l)) = c.lines.next_line() {
                    lines.push(l);
                }
            }
            for l in lines {
                let actions = server.handle_line(id, &l);
                done += apply(&mut conns, actions);
            }
            if closed {
                if server.rank_of(id).is_some() && !server.is_finalized(id) {
                    done += 1;
                }
                let actions = server.remove_conn(id);
                done += apply(&mut conns, actions);
                conns.remove(&id);
            }
        }
    }
}

/// Carries out the server's actions; returns how many ranks finalized.
fn apply(conns: &mut HashMap<ConnId, Conn>, actions: Vec<Action>) -> usize {
    let mut finalized = 0;
    for a in actions {
        match a {
            Action::Reply(to, text) => {
                if let Some(c) = conns.get_mut(&to) {
                    // Replies are small and clients read them at once; a
                    // stuck client hits the write timeout.
                    let _ = c.stream.set_nonblocking(false);
                    let _ = c.stream.write_all(text.as_bytes());
                    let _ = c.stream.set_nonblocking(true);
                }
            }
            Action::Log(m) => eprintln!("ibcoll: {m}"),
            Action::Finalized(_) => finalized += 1,
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
