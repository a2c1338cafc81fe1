//! Prints ibcoll's version, transports, the CMA probe result, and every
//! configuration variable with its default, current value and doc.

fn main() {
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
