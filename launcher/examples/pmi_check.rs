//! A rank program for the launcher's tests: bootstraps with the PMI client,
//! exchanges binary values of several sizes through put/fence/get, checks
//! every peer's values, and prints one line describing this rank.
//!
//! `pmi_check [abort|hang-rank0|exit-rank1 N|kill-rank1]` adds a failure for
//! the job-control tests. `pmi_check told-kill-rank1`: rank 1 is killed and
//! the others must hear of it from the launcher (rank 0 by watching
//! `Pmi::event_fd`, the others through a fence that fails). `pmi_check ring`
//! is the small job for many ranks: one value each, read only by the two
//! neighbours, and this rank's PMI counters (`ring-kill-rank1`: rank 1 is
//! killed after the first fence).

use ibcoll_launcher::Pmi;

fn value_for(rank: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64 * 31 + rank as u64 * 7 + 1) as u8)
        .collect()
}

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_default();
    if mode == "told-kill-rank1" {
        // Survivors must outlive the launcher's TERM long enough to report.
        let mut term = nix::sys::signal::SigSet::empty();
        term.add(nix::sys::signal::Signal::SIGTERM);
        term.thread_block().unwrap_or_else(|e| fail(e));
    }
    let mut pmi = match Pmi::init() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("pmi_check: {e}");
            std::process::exit(2);
        }
    };
    let (rank, size) = (pmi.rank(), pmi.size());
    if mode == "ring" || mode == "ring-kill-rank1" {
        ring(pmi, mode == "ring-kill-rank1");
        return;
    }
    // Sizes cover empty, one PMI value, and values split over many keys.
    let lens = [0usize, 1, 700, 3000, 20_000];
    for (i, &len) in lens.iter().enumerate() {
        let key = format!("v{i}.{rank}");
        if let Err(e) = pmi.put(&key, &value_for(rank, len)) {
            eprintln!("pmi_check: {e}");
            std::process::exit(2);
        }
    }
    if let Err(e) = pmi.fence() {
        eprintln!("pmi_check: {e}");
        std::process::exit(2);
    }
    for peer in 0..size {
        for (i, &len) in lens.iter().enumerate() {
            let got = match pmi.get(&format!("v{i}.{peer}")) {
                Ok(v) => v,
                Err(e) => {
                    eprintln!("pmi_check: {e}");
                    std::process::exit(2);
                }
            };
            if got != value_for(peer, len) {
                eprintln!("pmi_check: rank {rank}: value {i} of rank {peer} is corrupt");
                std::process::exit(2);
            }
        }
    }
    if pmi.try_get("no-such-key").ok().flatten().is_some() {
        eprintln!("pmi_check: a missing key returned a value");
        std::process::exit(2);
    }
    let nodes: Vec<String> = (0..size)
        .map(|r| pmi.node_of(r).map_or("?".into(), |n| n.to_string()))
        .collect();
    println!(
        "pmi_check ok rank={rank} size={size} node={} local={}/{} nodes={} map={} mode={:?}",
        pmi.node_id(),
        pmi.local_rank(),
        pmi.local_size(),
        pmi.num_nodes(),
        nodes.join(","),
        pmi.mode()
    );
    match mode.as_str() {
        "abort" if rank == size - 1 => pmi.abort(5, "pmi_check was asked to abort"),
        "hang-rank0" if rank == 0 => loop {
            std::thread::sleep(std::time::Duration::from_secs(1));
        },
        "exit-rank1" if rank == 1 => std::process::exit(3),
        "kill-rank1" | "told-kill-rank1" if rank == 1 => {
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        }
        "told-kill-rank1" => told(pmi),
        _ => {}
    }
    if mode != "no-final-fence" {
        if let Err(e) = pmi.fence() {
            eprintln!("pmi_check: {e}");
            std::process::exit(2);
        }
    }
    if let Err(e) = pmi.finalize() {
        eprintln!("pmi_check: {e}");
        std::process::exit(2);
    }
}

fn fail(e: impl std::fmt::Display) -> ! {
    eprintln!("pmi_check: {e}");
    std::process::exit(2);
}

fn ring(mut pmi: Pmi, kill_rank1: bool) {
    let (rank, size) = (pmi.rank(), pmi.size());
    pmi.put(&format!("card{rank}"), &value_for(rank, 40))
        .unwrap_or_else(|e| fail(e));
    pmi.fence().unwrap_or_else(|e| fail(e));
    if kill_rank1 && rank == 1 {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
    for peer in [(rank + 1) % size, (rank + size - 1) % size] {
        let got = pmi.get(&format!("card{peer}")).unwrap_or_else(|e| fail(e));
        if got != value_for(peer, 40) {
            fail(format!("rank {rank}: the card of rank {peer} is corrupt"));
        }
    }
    pmi.fence().unwrap_or_else(|e| fail(e));
    let s = pmi.stats();
    println!(
        "pmi_check ring ok rank={rank} size={size} notify={} puts={} gets={} fences={} bytes_fetched={}",
        pmi.event_fd().is_some(),
        s.puts,
        s.gets,
        s.fences,
        s.bytes_fetched
    );
    pmi.finalize().unwrap_or_else(|e| fail(e));
}

/// A survivor of rank 1's death (TERM held off since main): hears of it,
/// says so, and leaves.
fn told(mut pmi: Pmi) -> ! {
    let rank = pmi.rank();
    let mut lost = Vec::new();
    let how = if rank == 0 {
        let Some(fd) = pmi.event_fd() else {
            fail("the launcher offers no event descriptor");
        };
        // News read during an earlier call no longer makes the descriptor
        // readable: look before waiting, as an engine does before it sleeps.
        lost = pmi.take_failures();
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        if lost.is_empty() {
            // SAFETY: one valid pollfd; the descriptor stays open (pmi lives).
            let n = unsafe { libc::poll(&mut pfd, 1, 60_000) };
            if n != 1 {
                fail("no news of rank 1 within 60 s");
            }
            "event_fd"
        } else {
            "an earlier call"
        }
    } else {
        match pmi.fence() {
            Ok(()) => fail("a fence without rank 1 succeeded"),
            Err(e) => eprintln!("pmi_check: rank {rank}: expected: {e}"),
        }
        "fence"
    };
    lost.extend(pmi.take_failures());
    match lost.as_slice() {
        [(1, reason)] => println!("pmi_check rank {rank} told ({how}): rank 1 {reason}"),
        other => fail(format!("rank {rank} was told {other:?}")),
    }
    if !pmi.take_failures().is_empty() {
        fail("a failure was reported twice");
    }
    // Finalize, so that a rank hosting the `srun --mpi=none` store stays
    // until the other survivors are done with it.
    pmi.finalize().unwrap_or_else(|e| fail(e));
    std::process::exit(0);
}
