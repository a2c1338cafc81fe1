//! A rank program for the launcher's tests: bootstraps with the PMI client,
//! exchanges binary values of several sizes through put/fence/get, checks
//! every peer's values, and prints one line describing this rank.
//!
//! `pmi_check [abort|hang-rank0|exit-rank1 N|kill-rank1]` adds a failure for
//! the job-control tests.

use ibcoll_launcher::Pmi;

fn value_for(rank: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64 * 31 + rank as u64 * 7 + 1) as u8)
        .collect()
}

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let mut pmi = match Pmi::init() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("pmi_check: {e}");
            std::process::exit(2);
        }
    };
    let (rank, size) = (pmi.rank(), pmi.size());
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
        "kill-rank1" if rank == 1 => {
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        }
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
