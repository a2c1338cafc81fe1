//! The quick-start demo: every rank passes a token to its right neighbour
//! through the PMI key-value space and prints what it received.

use ibcoll_launcher::Pmi;

fn main() {
    if let Err(e) = run() {
        eprintln!("ring: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), ibcoll_launcher::PmiError> {
    let mut pmi = Pmi::init()?;
    let (rank, size) = (pmi.rank(), pmi.size());
    let token = format!("token from rank {rank} (pid {})", std::process::id());
    pmi.put(&format!("ring.{}", (rank + 1) % size), token.as_bytes())?;
    pmi.fence()?;
    let got = pmi.get(&format!("ring.{rank}"))?;
    println!(
        "rank {rank} of {size} on node {} (local {}/{}): received \"{}\"",
        pmi.node_id(),
        pmi.local_rank(),
        pmi.local_size(),
        String::from_utf8_lossy(&got)
    );
    pmi.finalize()
}
