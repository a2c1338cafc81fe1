//! Prints ibcoll's version, transports, the CMA probe result, and every
//! configuration variable with its default, current value and doc.

const USAGE: &str = "\
usage: ibcoll-info [options]

Prints ibcoll's version, its transports and whether rdma and single-copy
shared memory (CMA) work here, checks the IBCOLL_* variables of the
environment, and lists every variable with its default and current value.

options:
  -h, --help     this text
  -V, --version  print the version
  --ppn N        the shared-memory segment a node of N ranks gets with this
                 configuration: its size, the formula and what each part is
";

/// `--ppn N`: the segment size, its formula and its parts.
fn segment(ppn: &str) {
    let n: usize = match ppn.parse() {
        Ok(n) if n >= 1 => n,
        _ => {
            eprintln!("ibcoll-info: --ppn wants a number of ranks >= 1, not {ppn:?}");
            std::process::exit(2);
        }
    };
    let l = match ibcoll::shm_layout(n) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("ibcoll-info: {e}");
            std::process::exit(2);
        }
    };
    let p = *l.params();
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    let align = |x: usize, a: usize| x.div_ceil(a) * a;
    let boxb = align(ibcoll_shm::ring::region_len(p.ring_bytes), 128);
    let claims = ibcoll_shm::CLAIM_SLOTS * 128;
    let queue = if p.queue_bytes > 0 {
        align(ibcoll_shm::queue::region_len(p.queue_bytes), 128)
    } else {
        0
    };
    let pipe = if p.pipe_slots > 0 {
        align(
            ibcoll_shm::pipeline::region_len(p.pipe_slots, p.pipe_chunk).unwrap_or(0),
            4096,
        )
    } else {
        0
    };
    let slots = p.extra_bytes / n;
    let small = 128 + ibcoll_shm::layout::RANK_SLOT + 128 + ibcoll_shm::queue::INTENT_BYTES;
    let per_rank = queue + pipe + slots + small;
    let boxes = l.boxes();
    let grants = align(8 * n, 128);
    let total = l.total_len();
    println!(
        "shm segment for {n} ranks per node: {total} B ({:.1} MiB, {:.2} MiB per rank)",
        mib(total),
        mib(total) / n as f64
    );
    println!("  formula: 4096 + n * ({per_rank} + min(n - 1, {}) * {boxb} + ceil128(8 * n)) + n * (n - 1) * {claims} B (each area rounded up to a page)", p.boxes);
    println!("  per rank: receive queue {queue} B, pipe {pipe} B, collective slots {slots} B, doorbell + rank slot + pipe owner + queue intent {small} B, {boxes} fast boxes of {boxb} B, grant words {grants} B");
    println!("  per ordered pair: claim slots {claims} B");
    println!("  (IBCOLL_SHM_QUEUE_BYTES, IBCOLL_SHM_PIPE_SLOTS x IBCOLL_SHM_PIPE_CHUNK, IBCOLL_SHM_COLL_BYTES, IBCOLL_SHM_BOXES x IBCOLL_SHM_BOX_BYTES; no pipe with IBCOLL_CMA=on)");
}

fn main() {
    // Four flags do not need an argument parser; anything else is an
    // error, so a mistyped flag is not silently ignored.
    if let Some(a) = std::env::args().nth(1) {
        match a.as_str() {
            "-h" | "--help" => print!("{USAGE}"),
            "-V" | "--version" => println!("ibcoll-info (ibcoll) {}", ibcoll::VERSION),
            "--ppn" => match std::env::args().nth(2) {
                Some(n) => segment(&n),
                None => {
                    eprintln!("ibcoll-info: --ppn needs a number of ranks");
                    std::process::exit(2);
                }
            },
            _ => {
                eprintln!("ibcoll-info: unknown option {a:?} (see ibcoll-info --help)");
                std::process::exit(2);
            }
        }
        return;
    }
    println!("ibcoll {}", ibcoll::VERSION);
    let (cma, why) = ibcoll::cma_status();
    println!(
        "transports: self, shm (same node), rdma (other nodes, verbs), tcp (other nodes, fallback)"
    );
    let (rdma, what) = ibcoll::rdma_status();
    println!(
        "rdma: {} ({what})",
        if rdma {
            "available"
        } else {
            "unavailable, tcp between nodes"
        }
    );
    println!(
        "shm single copy (CMA): {} ({why})",
        if cma {
            "available"
        } else {
            "unavailable, pipelined copy used"
        }
    );
    match ibcoll::tcp_address_status() {
        Ok((addrs, why)) => println!("tcp: publishes {addrs} ({why})"),
        Err(e) => println!("tcp: no address to publish: {e}"),
    }
    match ibcoll::config::Config::from_env() {
        Ok(_) => println!("configuration: valid"),
        Err(e) => println!("configuration: INVALID: {e}"),
    }
    println!();
    println!(
        "{:<24} {:<16} {:<16} description",
        "variable", "default", "current"
    );
    for e in ibcoll::config::REGISTRY {
        let cur = std::env::var(e.name).unwrap_or_else(|_| "-".into());
        println!("{:<24} {:<16} {:<16} {}", e.name, e.default, cur, e.doc);
    }
}
